"""Selection state reset around a block: what every test suite of vllm-ir needs.

Tests change process-wide state: priorities (``apply()``), environment
variables that selection reads once per cache generation, and the caches.
:func:`isolated` starts a block from a clean slate and puts it back after; the
pytest plugin (:mod:`vllm_ir.testing.pytest_plugin`) wraps it in a fixture.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

from vllm_ir._base.cache import invalidate_caches
from vllm_ir.priority import isolated_process_priorities

__all__ = ["SELECTION_ENV", "inductor_caches_off", "isolated"]

SELECTION_ENV = ("VLLM_BATCH_INVARIANT", "VLLM_IR_PLATFORM")
"""The environment variables selection reads (a test sets them where it means to)."""


@contextlib.contextmanager
def isolated(unset: Sequence[str] = SELECTION_ENV) -> Iterator[None]:
    """Run the block with no process-wide priorities, ``unset`` unset and fresh caches.

    Afterwards the priorities and variables are put back as they were and the
    caches invalidated again, so nothing selected inside survives the block.

    >>> import os, vllm_ir as ir
    >>> os.environ["VLLM_BATCH_INVARIANT"] = "1"
    >>> with isolated():
    ...     "VLLM_BATCH_INVARIANT" in os.environ
    False
    >>> os.environ.pop("VLLM_BATCH_INVARIANT")
    '1'
    """
    saved_env = {name: os.environ.get(name) for name in unset}
    for name in unset:
        os.environ.pop(name, None)
    invalidate_caches()
    try:
        with isolated_process_priorities():
            yield
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        invalidate_caches()


@contextlib.contextmanager
def inductor_caches_off() -> Iterator[None]:
    """Compile without Inductor's FX graph and AOTAutograd caches.

    On a cache hit vllm-ir's passes do not run, so their records
    (``selected_impls``, clone counts) stay empty; tests that read them,
    and the demo, compile under this.
    """
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    with (
        inductor_config.patch(fx_graph_cache=False, fx_graph_remote_cache=False),
        functorch_config.patch(enable_autograd_cache=False),
    ):
        yield
