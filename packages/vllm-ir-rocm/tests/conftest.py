"""Shared fixtures: the provider loaded once, per-test isolation, and the AITER stand-in.

On a machine without a ROCm GPU the ``aiter`` impls are registered
unsupported. The wiring tests use :func:`aiter_stand_in`: a CPU stand-in
``aiter`` module in ``sys.modules`` and :func:`vllm_ir_rocm.availability.forced`
saying "supported, on CPU tensors", under which the package's own
``register_kernels`` registers the impls again; afterwards the registration
the machine really supports is restored.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import vllm_ir as ir
import vllm_ir_rocm
from rocm_stand_ins import StandInAiter
from vllm_ir import providers
from vllm_ir.testing import SELECTION_ENV, isolated
from vllm_ir_rocm import availability, layernorm

PROVIDER = vllm_ir_rocm.PROVIDER
OPS = (ir.ops.rms_norm, ir.ops.fused_add_rms_norm)


def pytest_configure(config: pytest.Config) -> None:
    # at collection, so that parametrizing over the provider's impls finds them
    if PROVIDER not in ir.loaded_providers() and PROVIDER not in ir.ops.rms_norm.impls:
        providers.load_provider(PROVIDER, "vllm-ir-rocm (source tree)", vllm_ir_rocm.provider)


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
def aiter_stand_in() -> Iterator[StandInAiter]:
    """The ``aiter`` impls registered supported, on CPU, over a stand-in ``aiter`` module."""
    stand_in = StandInAiter()
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, availability.MODULE, stand_in.module)
        with availability.forced(availability.Availability(True, device_type="cpu")):
            _register_again()
            yield stand_in
    _register_again()


@pytest.fixture
def aiter(aiter_stand_in: StandInAiter) -> Iterator[StandInAiter]:
    """:func:`aiter_stand_in` with its call record emptied for this test."""
    aiter_stand_in.calls.clear()
    yield aiter_stand_in
    aiter_stand_in.calls.clear()
