"""The conformance kit over both providers.

Every check runs for ``triton`` in float32. The kernel checks (correctness,
supports_args, mutation) run for every dtype and both providers: bfloat16
included, which the interpreter computes exactly because the kernels round
float32 to bfloat16 themselves (see ``vllm_ir_triton.kernels``).

The wiring checks run once: ``opcheck`` tests the torch ops' schemas, fake
impls and autograd/AOT registration, and ``compiled`` the lowering, neither
of which depends on the dtype or differs between the providers (they share
every torch op and wrapper and differ only in launch configuration); under
the interpreter each costs seconds.

``triton`` alone implements ``silu_and_mul`` and the FP8 ops; they are in
its cases.
"""

from __future__ import annotations

import pytest
import torch
from triton_helpers import DEVICE, DTYPES
from vllm_ir.testing import ConformanceCase, conformance_cases
from vllm_ir_triton import BATCH_INVARIANT_PROVIDER, PROVIDER

KERNEL_CHECKS = ("correctness", "supports_args", "mutation")
WIRING_CHECKS = ("opcheck", "compiled")

ALL_CASES = [
    *conformance_cases(PROVIDER, dtypes=[torch.float32], device=DEVICE, checks=WIRING_CHECKS),
    *conformance_cases(PROVIDER, dtypes=DTYPES, device=DEVICE, checks=KERNEL_CHECKS),
    *conformance_cases(
        BATCH_INVARIANT_PROVIDER, dtypes=DTYPES, device=DEVICE, checks=KERNEL_CHECKS
    ),
]


CASES = ALL_CASES


@pytest.mark.parametrize("case", CASES, ids=str)
def test_conformance(case: ConformanceCase) -> None:
    case.check()
