"""The base of vllm-ir's Inductor passes: cache identity, timing, graph dumps."""

from __future__ import annotations

import hashlib
import inspect
import os
import stat
import time
from abc import abstractmethod
from pathlib import Path
from typing import Any, NamedTuple

from torch import fx
from torch._inductor.custom_graph_pass import CustomGraphPass

from vllm_ir import envs
from vllm_ir._base.logger import get_logger
from vllm_ir._version import __version__
from vllm_ir.compilation._context import _current_context, get_pass_context

__all__ = ["DUMP_ENV", "Uncacheable", "VllmIRPass"]

DUMP_ENV = envs.VLLM_IR_DUMP_GRAPHS
"""A directory: each pass writes the graph it produced there, for debugging."""

logger = get_logger(__name__)


class Uncacheable(NamedTuple):
    """A :meth:`VllmIRPass.cache_state` that no key can stand for: the pass's
    uuid is ``None``, and Inductor compiles the graph without its FX cache
    rather than risk serving a stale one."""

    why: str


_told_uncacheable: set[str] = set()


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
        state = self.cache_state()
        if isinstance(state, Uncacheable):
            if state.why not in _told_uncacheable:
                _told_uncacheable.add(state.why)
                logger.info("graphs are compiled without Inductor's FX cache: %s", state.why)
            return None
        h = hashlib.sha256()
        h.update(__version__.encode())
        h.update(source.encode())
        h.update(repr(state).encode())
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
_refused_dump_dirs: set[str] = set()


def _unsafe_dump_dir(directory: Path) -> str | None:
    """Why another user could redirect dumps written into ``directory`` (``None``: none)."""
    st = os.stat(directory)
    if st.st_uid not in (0, os.getuid()):
        return f"it is owned by uid {st.st_uid}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return f"group or others can write it (mode {stat.S_IMODE(st.st_mode):o}, no sticky bit)"
    return None


def _create(path: Path) -> int:
    """A new file at ``path``, never through a link someone planted there.

    ``O_EXCL | O_NOFOLLOW``: an existing name is never opened. A stale dump of
    ours (a reused pid) is removed first; anything else there raises.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o644)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise
        os.unlink(path)
        return os.open(path, flags, 0o644)  # one planted in between: FileExistsError


def _dump(name: str, graph: fx.Graph) -> None:
    """Write ``graph`` to ``$VLLM_IR_DUMP_GRAPHS`` (a debugging aid: failures only warn)."""
    directory = envs.dump_graphs_dir()
    if not directory:
        return
    global _dump_counter
    _dump_counter += 1
    path = Path(directory) / f"{os.getpid()}_{_dump_counter:04d}_{name}.txt"
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        problem = _unsafe_dump_dir(path.parent)
        if problem is not None:
            if directory not in _refused_dump_dirs:
                _refused_dump_dirs.add(directory)
                logger.warning(
                    "%s=%s: not writing graphs there, %s, so another user could plant links "
                    "that redirect them; use a directory only you can write",
                    DUMP_ENV,
                    directory,
                    problem,
                )
            return
        with os.fdopen(_create(path), "w") as f:
            f.write(str(graph))
    except OSError as e:
        logger.warning("%s: graph not written to %s: %s", name, path, e)
        return
    logger.info("%s: graph written to %s", name, path)
