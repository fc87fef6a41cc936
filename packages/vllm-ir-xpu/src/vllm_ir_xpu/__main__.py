"""``python -m vllm_ir_xpu``: whether the ``xpu_kernels`` impls can run here, and why not.

Exits 0 when they can; 1 when they cannot (with the reason), so that an XPU
machine's setup script can check that vllm-xpu-kernels is usable.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_ir_xpu",
        description="Report whether the xpu_kernels provider of vllm-ir can run here.",
    )
    parser.parse_args(argv)

    import torch

    from vllm_ir_xpu import API_VERSION, PROVIDER, __version__, availability
    from vllm_ir_xpu.ops import KIT

    found = availability.current()
    header = f"vllm-ir-xpu {__version__}: provider {PROVIDER!r}, vllm-ir provider API {API_VERSION}"
    return KIT.report(header, f"torch {torch.__version__}, XPU available: {found.hardware}", found)


if __name__ == "__main__":
    sys.exit(main())
