"""Triton's interpreter on machines without a GPU, and state reset per test.

``TRITON_INTERPRET=1`` must be set before the kernels are decorated, i.e.
before vllm-ir discovers this provider. pytest imports every conftest of the
test paths before any ``pytest_configure`` hook or collection, so it is set
here, at import. With a GPU Triton drives, the tests run the compiled kernels
on it instead; an explicit ``TRITON_INTERPRET`` in the environment is kept.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

from triton_helpers import gpu_device

if gpu_device() is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from vllm_ir.testing import isolated


def pytest_configure(config: pytest.Config) -> None:
    kernels = sys.modules.get("vllm_ir_triton.kernels")
    if gpu_device() is None and kernels is not None and not kernels.INTERPRETED:
        raise pytest.UsageError(
            "vllm-ir-triton's kernels were imported before TRITON_INTERPRET=1 was set "
            "(another conftest discovered the providers at import); set "
            "TRITON_INTERPRET=1 in the environment to run these tests without a GPU"
        )


@pytest.fixture(autouse=True)
def _isolated_state() -> Iterator[None]:
    """Process-wide priorities, env-driven selection and caches reset per test."""
    with isolated():
        yield
