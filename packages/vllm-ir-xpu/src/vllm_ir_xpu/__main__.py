"""``python -m vllm_ir_xpu``: whether the ``xpu_kernels`` impls can run here, and why not.

Exits 0 when they can; 1 when they cannot (with the reason), so that an XPU
machine's setup script can check that vllm-xpu-kernels is usable.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from vllm_ir_xpu import API_VERSION, __version__, availability
    from vllm_ir_xpu.ops import KIT

    def platform(found: availability.VendorAvailability) -> str:
        return f"XPU available: {found.hardware}"

    return KIT.main(argv, __version__, API_VERSION, availability.current, platform)


if __name__ == "__main__":
    sys.exit(main())
