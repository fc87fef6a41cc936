"""The vllm-ir pytest plugin (entry point ``pytest11``: ``vllm_ir``).

It adds one fixture, ``vllm_ir_isolated``: the test runs inside
:func:`vllm_ir.testing.isolated`. Nothing is autouse, so installing vllm-ir
changes no other test suite; a provider package's ``conftest.py`` opts in::

    @pytest.fixture(autouse=True)
    def _isolated(vllm_ir_isolated: None) -> None:
        pass

It also declares the ``slow`` marker (a test of ten seconds or more here:
subprocesses, cold compiles), so ``pytest -m "not slow"`` is the fast inner
loop of every package's suite; CI runs everything.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

__all__ = ["pytest_configure", "vllm_ir_isolated"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: ten seconds or more (subprocesses, cold compiles); -m 'not slow' skips"
    )


@pytest.fixture
def vllm_ir_isolated() -> Iterator[None]:
    """No process-wide priorities, selection variables unset, fresh caches; restored after."""
    from vllm_ir.testing.isolation import isolated

    with isolated():
        yield
