"""Shared fixtures: the provider loaded once, per-test isolation, and the kernel stand-ins.

On a machine without an Intel GPU the ``xpu_kernels`` impls are registered
unsupported. The wiring tests use :func:`xpu_stand_in`: stand-in
``vllm_xpu_kernels`` modules in ``sys.modules``, CPU stand-ins for the
``torch.ops._C`` kernels, and :func:`vllm_ir_xpu.availability.forced` saying
"supported, on CPU tensors", under which the package's own
``register_kernels`` registers the impls again; afterwards the registration
the machine really supports is restored.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import vllm_ir as ir
import vllm_ir_xpu
from vllm_ir import providers
from vllm_ir.testing import SELECTION_ENV, isolated
from vllm_ir_xpu import availability, layernorm
from xpu_stand_ins import StandInXpuKernels

PROVIDER = vllm_ir_xpu.PROVIDER
OPS = (ir.ops.rms_norm, ir.ops.fused_add_rms_norm)


def pytest_configure(config: pytest.Config) -> None:
    # at collection, so that parametrizing over the provider's impls finds them
    if PROVIDER not in ir.loaded_providers() and PROVIDER not in ir.ops.rms_norm.impls:
        providers.load_provider(PROVIDER, "vllm-ir-xpu (source tree)", vllm_ir_xpu.provider)


def _register_again() -> availability.Availability:
    for op in OPS:
        op.unregister_impl(PROVIDER)
    return layernorm.register_kernels(PROVIDER)


@pytest.fixture(autouse=True)
def _isolated_state() -> Iterator[None]:
    """Selection state reset per test; VLLM_IR_PROVIDERS unset too."""
    with isolated((*SELECTION_ENV, "VLLM_IR_PROVIDERS")):
        yield


@pytest.fixture(scope="module")
def xpu_stand_in() -> Iterator[StandInXpuKernels]:
    """The ``xpu_kernels`` impls registered supported, on CPU, over stand-in kernels."""
    with StandInXpuKernels() as stand_in, pytest.MonkeyPatch.context() as mp:
        for name, module in stand_in.modules.items():
            mp.setitem(sys.modules, name, module)
        with availability.forced(availability.Availability(True, device_type="cpu")):
            _register_again()
            yield stand_in
    _register_again()


@pytest.fixture
def kernels(xpu_stand_in: StandInXpuKernels) -> Iterator[StandInXpuKernels]:
    """:func:`xpu_stand_in` with its call record emptied for this test."""
    xpu_stand_in.calls.clear()
    yield xpu_stand_in
    xpu_stand_in.calls.clear()
