"""The base of vllm-ir's Inductor passes: cache identity, timing, graph dumps."""

from __future__ import annotations

import hashlib
import inspect
import os
import time
from abc import abstractmethod
from pathlib import Path
from typing import Any

from torch import fx
from torch._inductor.custom_graph_pass import CustomGraphPass

from vllm_ir import envs
from vllm_ir._version import __version__
from vllm_ir.compilation.context import _current_context, get_pass_context
from vllm_ir.logger import get_logger

__all__ = ["DUMP_ENV", "VllmIRPass", "source_hash"]

DUMP_ENV = envs.VLLM_IR_DUMP_GRAPHS
"""A directory: each pass writes the graph it produced there, for debugging."""

logger = get_logger(__name__)


def source_hash(*objects: object) -> str:
    """A hash of the source code of classes/functions (their repr if none)."""
    h = hashlib.sha256()
    for obj in objects:
        try:
            text = inspect.getsource(obj)  # type: ignore[arg-type]
        except (OSError, TypeError):
            text = repr(obj)
        h.update(text.encode())
    return h.hexdigest()


class VllmIRPass(CustomGraphPass):
    """A graph pass whose ``uuid()`` keys Inductor's FX graph cache.

    The uuid covers the pass's module source, vllm-ir's version and whatever
    :meth:`cache_state` returns, so a changed pass, priority or impl never
    reuses a graph compiled under the old one.
    """

    name: str = "pass"

    def __call__(self, graph: fx.Graph) -> None:
        start = time.perf_counter()
        self.run(graph)
        elapsed = (time.perf_counter() - start) * 1e3
        ctx = get_pass_context()
        ctx.timings_ms[self.name] = ctx.timings_ms.get(self.name, 0.0) + elapsed
        logger.debug("%s took %.2f ms", self.name, elapsed)
        _dump(self.name, graph)

    @abstractmethod
    def run(self, graph: fx.Graph) -> None: ...

    def cache_state(self) -> Any:
        """Extra state the compiled result depends on (hashable via repr)."""
        return None

    def uuid(self) -> str | None:
        """The cache identity; ``None`` (never cache) when the pass has no source."""
        try:
            source = inspect.getsource(inspect.getmodule(type(self)) or type(self))
        except (OSError, TypeError):
            return None  # defined in a REPL or exec'd code: a key could go stale
        h = hashlib.sha256()
        h.update(__version__.encode())
        h.update(source.encode())
        h.update(repr(self.cache_state()).encode())
        # Donations are recorded in node meta, which Inductor's cache key does
        # not see: a graph compiled for donated inputs (clones removed) must
        # never be served to the same graph whose inputs were not donated.
        h.update(repr(_donation_key()).encode())
        return h.hexdigest()


def _donation_key() -> tuple[tuple[str, str, str, bool], ...]:
    ctx = _current_context()
    if ctx is None:
        return ()
    return tuple((d.op, d.node, d.argument, d.graph_input) for d in ctx.donations)


_dump_counter = 0


def _dump(name: str, graph: fx.Graph) -> None:
    directory = envs.dump_graphs_dir()
    if not directory:
        return
    global _dump_counter
    _dump_counter += 1
    path = Path(directory) / f"{os.getpid()}_{_dump_counter:04d}_{name}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(graph))
    logger.info("%s: graph written to %s", name, path)
