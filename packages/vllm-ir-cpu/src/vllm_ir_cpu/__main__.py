"""``python -m vllm_ir_cpu build``: compile the kernels ahead of time.

Prints where the library is; exits 1 with the reason when it cannot be built
(no compiler, no ninja, a compile error).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_ir_cpu", description="vllm-ir-cpu kernels (provider cpu_c)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser(
        "build", help="build (or load from the cache) the C++ kernels and print where they are"
    )
    build_cmd.add_argument("-v", "--verbose", action="store_true", help="show compiler output")
    args = parser.parse_args(argv)

    from vllm_ir.provider import ExtensionBuildError, cache_root

    from vllm_ir_cpu import build

    start = time.perf_counter()
    try:
        path = build.build(verbose=args.verbose)
    except ExtensionBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a compile error: torch's message holds the compiler output
        print(f"error: building the vllm-ir-cpu kernels failed: {e}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - start
    print(f"{path}")
    print(
        f"built or loaded in {elapsed:.1f} s; flags: {' '.join(build.compile_flags())}; "
        f"cache: {cache_root()}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
