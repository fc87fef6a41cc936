"""Shared fixtures: the provider loaded once, per-test isolation, and the AITER stand-in.

On a machine without a ROCm GPU the ``aiter`` impls are registered
unsupported. The wiring tests use ``stand_in``: a CPU stand-in ``aiter``
module in ``sys.modules`` and :func:`vllm_ir_rocm.availability.forced` saying
"supported, on CPU tensors", under which the package's own
``register_kernels`` registers the impls again; afterwards the registration
the machine really supports is restored. ``kernels`` is that stand-in with
its call record emptied per test (:func:`vllm_ir.testing.vendor.vendor_fixtures`).
"""

from __future__ import annotations

from rocm_stand_ins import VENDOR
from vllm_ir.testing.vendor import vendor_fixtures

pytest_configure, _isolated_state, stand_in, kernels = vendor_fixtures(VENDOR)
