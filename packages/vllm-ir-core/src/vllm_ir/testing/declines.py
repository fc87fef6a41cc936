"""What an impl's ``supports_args`` declines: selection passes over it to ``native``.

:func:`assert_declined` checks one call; :data:`NORM_DECLINES` are the
arguments every norm kernel of the repository declines (the partial-variance
variant, dtypes the kernels do not compute in, a weight or residual that
native would promote or broadcast)::

    @pytest.mark.parametrize(("op", "why", "args"), NORM_DECLINES)
    def test_declined(op, why, args):
        assert_declined(ir.get_op(op), "my_kernels", args(), why)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from vllm_ir._op.op import IrOp

__all__ = ["NORM_DECLINES", "assert_declined"]

EPS = 1e-6


def _param(op: str, why: str, args: Any) -> Any:
    return pytest.param(op, why, args, id=f"{op}-{why}")


NORM_DECLINES = [
    _param("rms_norm", "variance_size", lambda: (torch.randn(4, 96), torch.ones(96), EPS, 64)),
    _param("rms_norm", "float64", lambda: (torch.randn(4, 8).double(), None, EPS)),
    _param(
        "rms_norm",
        "weight dtype differs",
        lambda: (torch.randn(4, 8).bfloat16(), torch.ones(8), EPS),
    ),
    _param("rms_norm", "2-D weight", lambda: (torch.randn(4, 8), torch.ones(1, 8), EPS)),
    _param(
        "fused_add_rms_norm",
        "variance_size",
        lambda: (torch.randn(4, 96), torch.randn(4, 96), None, EPS, 64),
    ),
    _param(
        "fused_add_rms_norm",
        "residual dtype",
        lambda: (torch.randn(4, 8), torch.randn(4, 8).half(), None, EPS),
    ),
    _param(
        "fused_add_rms_norm",
        "broadcast residual",
        lambda: (torch.randn(4, 8), torch.randn(8), None, EPS),
    ),
]
"""``(op name, why, args factory)`` params of arguments every norm kernel here declines."""


def assert_declined(
    op: IrOp, provider: str, args: Sequence[Any], why: str = "", *, run: bool = True
) -> Any:
    """``provider`` declines ``args`` by its ``supports_args``: ``native`` is selected.

    With ``run``, also checks that running the op gives native's result (pass
    ``False`` for arguments native itself rejects); returns the
    :class:`~vllm_ir.selection.Selection` for further checks. ``native`` is
    named after ``provider``, so installed providers' defaults do not come
    first.
    """
    with op.set_priority([provider, "native"]):
        selection = op.select(*args)
        got = op(*args) if run else None
    assert selection.impl.provider == "native", why
    first = selection.decisions[0]
    assert first.entry.provider == provider, why
    assert "supports_args returned False" in first.reason, why
    if run:
        torch.testing.assert_close(got, op.native(*args))
    return selection
