"""Which package brings each of the project's providers: named where one is unknown."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import metadata

__all__ = ["PROVIDER_PACKAGES", "where_provider_comes_from"]

PROVIDER_PACKAGES = {
    "cpu_c": "vllm-ir-cpu",
    "vllm_c": "vllm-ir-cuda",
    "triton": "vllm-ir-triton",
    "triton_batch_invariant": "vllm-ir-triton",
    "aiter": "vllm-ir-rocm",
    "xpu_kernels": "vllm-ir-xpu",
}
"""The provider names the project's packages register (each package's ``PROVIDER``)."""


def where_provider_comes_from(providers: Sequence[str]) -> str:
    """For unknown ``providers``: the clause naming the package of each that one of the
    project's packages brings, and whether it is installed ('' for none).

    >>> where_provider_comes_from(["no_such"])
    ''
    """
    notes = []
    for name in providers:
        package = PROVIDER_PACKAGES.get(name)
        if package is None:
            continue
        try:
            metadata.version(package)
        except metadata.PackageNotFoundError:
            notes.append(f"{name} comes with {package}, not installed here: pip install {package}")
        else:
            notes.append(f"{name} comes with {package}, installed, without an impl of this op")
    return f" ({'; '.join(notes)})" if notes else ""
