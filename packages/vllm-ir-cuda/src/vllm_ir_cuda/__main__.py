"""``python -m vllm_ir_cuda build``: compile and load the CUDA kernels ahead of time.

Exits 0 with the library's path once the kernels are built (or found in the
cache) and loaded; exits 1 with the reason when they cannot be built here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_ir_cuda",
        description="Tools of vllm-ir-cuda, the vllm_c kernel provider of vllm-ir.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser(
        "build",
        help="build the CUDA kernels now (cached; otherwise built on their first call)",
    )
    build.add_argument("-v", "--verbose", action="store_true", help="show the compiler commands")
    args = parser.parse_args(argv)

    from vllm_ir.provider import ExtensionBuildError, cache_root

    from vllm_ir_cuda import _build

    try:
        library = _build.load(verbose=args.verbose)
    except ExtensionBuildError as e:
        print(f"vllm_ir_cuda: cannot build the CUDA kernels here: {e}", file=sys.stderr)
        return 1
    except (RuntimeError, OSError) as e:  # a compiler or linker failure
        print(
            f"vllm_ir_cuda: building the CUDA kernels failed: {e}\n"
            f"(build directories are under {cache_root() / 'extensions'}; "
            "rerun with --verbose for the compiler commands)",
            file=sys.stderr,
        )
        return 1
    print(f"vllm_ir_cuda: CUDA kernels built and loaded from {library}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
