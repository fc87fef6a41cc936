"""The IR ops declared in this process, by name.

At the bottom of the package (it imports nothing of ``vllm_ir``), so provider
discovery can check a provider's defaults against the declared ops without
importing the op machinery, which itself runs discovery before selecting.
:attr:`vllm_ir.IrOp.registry` is a read-only view of the same dict.
"""

from __future__ import annotations

from typing import Any

__all__: list[str] = []

OPS: dict[str, Any] = {}
"""Op name -> :class:`vllm_ir.IrOp`; written only by ``vllm_ir.op``."""
