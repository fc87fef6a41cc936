"""A stand-in for ``importlib.metadata.entry_points`` that serves one group from a test's table."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any

import pytest

Entry = tuple[str, str, str, object]
"""``(entry-point name, module name, attribute, the object the attribute holds)``."""


def serving(
    monkeypatch: pytest.MonkeyPatch,
    group: str,
    entries: Callable[[], Iterable[Entry]],
    fallback: Callable[..., Any],
) -> Callable[..., Any]:
    """``entry_points(group=group)`` lists ``entries()`` (read at each call), each
    object in a throwaway module; every other group is ``fallback``'s, since
    importlib.metadata is shared with other libraries (triton keeps its own)."""

    def entry_points(**params: Any) -> Any:
        if params.get("group") != group:
            return fallback(**params)
        eps = []
        for name, module_name, attribute, obj in entries():
            module = types.ModuleType(module_name)
            setattr(module, attribute, obj)
            monkeypatch.setitem(sys.modules, module_name, module)
            eps.append(metadata.EntryPoint(name, f"{module_name}:{attribute}", group))
        return eps

    return entry_points
