"""Shared fixtures: the kernels built once per session, and state reset per test.

The build goes to ``$VLLM_IR_CACHE_DIR`` (nox points it into the checkout's
``.cache``, which CI keeps), so only the first session on a machine compiles.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_ir.testing import isolated
from vllm_ir_cpu import build


@pytest.fixture(scope="session")
def kernels() -> Path:
    """Build (or load from the cache) the C++ kernels, once per session."""
    problem = build.toolchain_problem()
    if problem is not None:
        pytest.skip(f"cannot build the cpu_c kernels here: {problem}")
    return build.build()


@pytest.fixture(autouse=True)
def _isolated_state() -> Iterator[None]:
    """Process-wide priorities, env-driven selection and caches reset per test."""
    with isolated():
        yield
