"""Shared fixtures: the provider loaded once, per-test isolation, and the kernel stand-ins.

On a machine without an Intel GPU the ``xpu_kernels`` impls are registered
unsupported. The wiring tests use ``stand_in``: stand-in ``vllm_xpu_kernels``
modules in ``sys.modules``, CPU stand-ins for the ``torch.ops._C`` kernels,
and :func:`vllm_ir_xpu.availability.forced` saying "supported, on CPU
tensors", under which the package's own ``register_kernels`` registers the
impls again; afterwards the registration the machine really supports is
restored. ``kernels`` is that stand-in with its call record emptied per test
(:func:`vllm_ir.testing.vendor.vendor_fixtures`).
"""

from __future__ import annotations

from vllm_ir.testing.vendor import vendor_fixtures
from xpu_stand_ins import VENDOR

pytest_configure, _isolated_state, stand_in, kernels = vendor_fixtures(VENDOR)
