"""``python -m vllm_ir_rocm``: whether the ``aiter`` impls can run here, and why not.

Exits 0 when they can; 1 when they cannot (with the reason), so that a ROCm
machine's setup script can check that AITER is usable.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    import torch

    from vllm_ir_rocm import API_VERSION, __version__, availability
    from vllm_ir_rocm.ops import KIT

    hip = f"HIP {getattr(torch.version, 'hip', None)}"
    return KIT.main(argv, __version__, API_VERSION, availability.current, lambda _: hip)


if __name__ == "__main__":
    sys.exit(main())
