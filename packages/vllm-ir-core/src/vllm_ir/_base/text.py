"""Bounded text of user input, for one-line error messages.

Errors quote what the user gave; input can be huge (20,000 provider names, a
5,000-digit number) or deeply nested (a list 20,000 levels deep, whose plain
``repr`` recurses until ``RecursionError``). Everything here has a fixed bound.

>>> short_repr(list(range(100)), limit=20)
'[0, 1, 2, 3, 4, 5... (29 chars)'
>>> listing([f"p{i}" for i in range(100)], limit=3)
"'p0', 'p1', 'p2' and 97 more"
"""

from __future__ import annotations

import reprlib
from collections.abc import Sequence

__all__ = ["json_nesting_depth", "listing", "short_repr", "short_text", "typed_repr"]

_REPR = reprlib.Repr()
_REPR.maxlevel = 4  # nesting shown; deeper levels print as [...], without recursing
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 8
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 60


def short_text(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text)} chars)"


def short_repr(value: object, limit: int = 80, *, with_type: bool = False) -> str:
    """A ``repr`` of ``value`` of at most ``limit`` characters (``with_type``: prefixed
    with its type's name), whatever its size or depth."""
    try:
        # strings whole, so the length said is theirs; containers to a bounded depth
        whole = isinstance(value, (str, bytes))
        text = short_text(repr(value) if whole else _REPR.repr(value), limit)
    except (ValueError, RecursionError):  # e.g. an int of more digits than str() takes
        text = f"<{type(value).__name__} too large to show>"
    return f"{type(value).__name__} {text}" if with_type else text


def typed_repr(value: object, limit: int = 80) -> str:
    """:func:`short_repr` prefixed with the value's type, for "got ..." in errors.

    >>> typed_repr([1, 2])
    'list [1, 2]'
    """
    return short_repr(value, limit, with_type=True)


def listing(names: Sequence[str], limit: int = 8) -> str:
    """``'a', 'b', 'c'``: the first ``limit`` names quoted (each cut short), then how
    many more."""
    shown = ", ".join(short_repr(n, 40) for n in names[:limit])
    more = len(names) - limit
    return shown if more <= 0 else f"{shown} and {more} more"


def json_nesting_depth(text: str, limit: int) -> int:
    """The deepest bracket nesting of JSON ``text`` (strings skipped), counted up
    to just past ``limit``: ``json.loads`` recurses, so deeper input must be
    refused before it is parsed (a ``RecursionError`` otherwise).

    >>> json_nesting_depth('{"a": [[1], "[["]}', limit=32), json_nesting_depth("[" * 10**5, 32)
    (3, 33)
    """
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        elif ch in "]}":
            depth -= 1
    return deepest
