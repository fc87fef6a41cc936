"""``python -m vllm_ir_rocm``: whether the ``aiter`` impls can run here, and why not.

Exits 0 when they can; 1 when they cannot (with the reason), so that a ROCm
machine's setup script can check that AITER is usable.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_ir_rocm",
        description="Report whether the aiter provider of vllm-ir can run in this environment.",
    )
    parser.parse_args(argv)

    import torch

    from vllm_ir_rocm import API_VERSION, PROVIDER, __version__, availability
    from vllm_ir_rocm.ops import KIT

    found = availability.current()
    header = (
        f"vllm-ir-rocm {__version__}: provider {PROVIDER!r}, vllm-ir provider API {API_VERSION}"
    )
    return KIT.report(
        header, f"torch {torch.__version__}, HIP {getattr(torch.version, 'hip', None)}", found
    )


if __name__ == "__main__":
    sys.exit(main())
