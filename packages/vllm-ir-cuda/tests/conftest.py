"""Shared fixtures: the provider loaded once, per-test isolation, and CPU stand-ins.

``standin`` registers the very impl functions of vllm_c under a second
provider name whose ``supports_args`` accepts CPU tensors, over the CPU
kernels of :mod:`cuda_stand_ins`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import vllm_ir as ir
import vllm_ir_cuda
from cuda_stand_ins import STANDIN, StandInKernels
from vllm_ir.testing import SELECTION_ENV, isolated, load_provider
from vllm_ir_cuda import layernorm

PROVIDER = vllm_ir_cuda.PROVIDER


@pytest.fixture(scope="session", autouse=True)
def _vllm_c_loaded() -> None:
    """The provider as discovery loads it; loaded by hand when run from a source tree."""
    if PROVIDER not in ir.loaded_providers():
        load_provider(PROVIDER, "vllm-ir-cuda (source tree)", vllm_ir_cuda.provider)


@pytest.fixture(autouse=True)
def _isolated_state() -> Iterator[None]:
    """Selection state reset per test; VLLM_IR_PROVIDERS unset too."""
    with isolated((*SELECTION_ENV, "VLLM_IR_PROVIDERS")):
        yield


@pytest.fixture
def cpu_kernels() -> Iterator[StandInKernels]:
    kernels = StandInKernels()
    yield kernels
    kernels.close()


@pytest.fixture
def standin(cpu_kernels: StandInKernels) -> Iterator[StandInKernels]:
    """The vllm_c impl functions, registered as provider STANDIN over the CPU kernels."""
    rms_supports, fused_supports = layernorm.supports_args_for("cpu")
    ir.ops.rms_norm.register_impl(STANDIN, supports_args=rms_supports)(layernorm.rms_norm)
    ir.ops.fused_add_rms_norm.register_impl(STANDIN, supports_args=fused_supports, inplace=True)(
        layernorm.fused_add_rms_norm
    )
    yield cpu_kernels
    ir.ops.rms_norm.unregister_impl(STANDIN)
    ir.ops.fused_add_rms_norm.unregister_impl(STANDIN)
