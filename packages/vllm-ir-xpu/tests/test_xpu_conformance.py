"""The conformance kit over the ``xpu_kernels`` impls, with stand-in kernels on CPU.

What it checks here is the wiring: that the impls and their predicates keep
the ops' contracts (results within tolerance of the native semantics,
plain-bool predicates that ignore the batch size, the in-place declaration,
eager == compiled, ``opcheck``). The SYCL kernels' numerics are checked only
by ``test_xpu_hardware.py``, on an Intel GPU.
"""

from __future__ import annotations

import pytest
import vllm_ir as ir
from vllm_ir.testing import ConformanceCase, conformance_cases
from vllm_ir_xpu import PROVIDER, ops

pytestmark = pytest.mark.usefixtures("xpu_stand_in")

CASES = conformance_cases(
    PROVIDER, ops=[ir.ops.rms_norm, ir.ops.fused_add_rms_norm], dtypes=ops.DTYPES
)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_conformance(case: ConformanceCase) -> None:
    case.check()
