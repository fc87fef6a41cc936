"""The conformance kit over the ``aiter`` impls, with the stand-in ``aiter`` on CPU.

What it checks here is the wiring: that the impls and their predicates keep
the ops' contracts (results within tolerance of the native semantics,
plain-bool predicates that ignore the batch size, the in-place declaration,
eager == compiled, ``opcheck``). AITER's numerics are checked only by
``test_rocm_hardware.py``, on a ROCm GPU.
"""

from __future__ import annotations

import pytest
import vllm_ir as ir
from vllm_ir.testing import ConformanceCase, conformance_cases
from vllm_ir_rocm import PROVIDER, ops

pytestmark = pytest.mark.usefixtures("aiter_stand_in")

CASES = conformance_cases(
    PROVIDER, ops=[ir.ops.rms_norm, ir.ops.fused_add_rms_norm], dtypes=ops.DTYPES
)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_conformance(case: ConformanceCase) -> None:
    case.check()
