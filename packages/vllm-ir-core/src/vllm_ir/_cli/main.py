"""Running a parsed ``vllm-ir`` command line (parsing is torch-free: :mod:`vllm_ir_cli`)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
from collections.abc import Iterator, Sequence

from vllm_ir_cli.commands import COMMANDS

from vllm_ir._cli.args import set_threads_early
from vllm_ir.config import parse_ir_op_priority_args, parse_ir_pass_args

__all__ = ["run"]

# commands that list provider load failures themselves: the logged warning would repeat them
_LISTS_LOAD_ERRORS = {"ops", "demo"}


class _DropLoadFailures(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to load" not in record.getMessage()


@contextlib.contextmanager
def _load_failures_not_logged(command: str) -> Iterator[None]:
    if command not in _LISTS_LOAD_ERRORS:
        yield
        return
    log = logging.getLogger("vllm_ir.providers")
    drop = _DropLoadFailures()
    log.addFilter(drop)
    try:
        from vllm_ir._discovery.providers import ensure_loaded

        ensure_loaded()  # discovery happens here, under the filter
    finally:
        log.removeFilter(drop)
    yield


def run(args: argparse.Namespace, priority_flags: Sequence[str], pass_flags: Sequence[str]) -> int:
    """Validate the selection flags against the registry, then run ``args.command``."""
    set_threads_early(getattr(args, "threads", 0))  # @FILE's stamps name a thread count
    with _load_failures_not_logged(args.command):
        config, rest = parse_ir_op_priority_args(priority_flags)
        passes, rest = parse_ir_pass_args([*rest, *pass_flags])
        assert not rest, rest  # split_selection_flags only passes flags of these two kinds
        args.passes = passes
        module = importlib.import_module(COMMANDS[args.command])
        with config.scope(), _torch_wrap(getattr(args, "torch_wrap", None)):
            return int(module.run(args))


@contextlib.contextmanager
def _torch_wrap(enabled: bool | None) -> Iterator[None]:
    """``--ir-torch-wrap``: the command runs in that mode (``None``: unchanged)."""
    if enabled is None:
        yield
        return
    from vllm_ir._base.torch_wrap import enable_torch_wrap

    with enable_torch_wrap(enabled):
        yield
