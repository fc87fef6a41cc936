"""The one warning category of vllm-ir's deprecations, and the call that warns.

A category of its own lets a user (or a test suite) filter exactly these:
``-W error::vllm_ir._base.deprecation.VllmIRDeprecationWarning`` turns every use of
a deprecated vllm-ir name into an error and leaves other libraries' alone.

>>> import warnings
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     warn_deprecated("old() is deprecated: use new()")
>>> caught[0].category.__name__, issubclass(caught[0].category, DeprecationWarning)
('VllmIRDeprecationWarning', True)
"""

from __future__ import annotations

import warnings

__all__ = ["VllmIRDeprecationWarning", "warn_deprecated"]


class VllmIRDeprecationWarning(DeprecationWarning):
    """A deprecated vllm-ir name or call: it goes in the next release."""


def warn_deprecated(message: str, *, stacklevel: int = 2) -> None:
    """Warn with :class:`VllmIRDeprecationWarning`, attributed ``stacklevel``
    frames up from the caller of this function (2: the caller's caller)."""
    warnings.warn(message, VllmIRDeprecationWarning, stacklevel=stacklevel + 1)
