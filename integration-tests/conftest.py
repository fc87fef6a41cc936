"""Setup shared by the integration tests, which need the wheels built by ``nox -s integration``."""

from __future__ import annotations

import os
from importlib import metadata

import pytest

FIXTURE_DISTRIBUTIONS = (
    "vllm-ir-core",
    "vllm-ir-example-provider",
    "vllm-ir-broken-provider",
    "vllm-ir-incompatible-provider",
    "vllm-ir-hostile-provider",
    "vllm-ir-nova-platform",
)

HOSTILE_PROVIDERS = ("hostile_defaults", "hostile_exit", "hostile_partial", "hostile_signature")

IN_PROCESS_PROVIDERS = ",".join(("example", "broken", "incompatible", *HOSTILE_PROVIDERS))
"""The allow-list of the in-process tests: whatever other provider packages
``packages/`` holds, the priorities and selections they assert stay exact.
The subprocess tests cover the other providers being installed alongside."""


def pytest_configure(config: pytest.Config) -> None:
    missing = []
    for dist in FIXTURE_DISTRIBUTIONS:
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            missing.append(dist)
    if missing:
        raise pytest.UsageError(
            f"not installed: {', '.join(missing)}; these tests run against built wheels, "
            "run them with `nox -s integration`"
        )
    # Set before any test triggers discovery (lazy, once per process); the
    # example provider ships CPU defaults only, so pin the platform too.
    os.environ["VLLM_IR_PROVIDERS"] = IN_PROCESS_PROVIDERS
    os.environ["VLLM_IR_PLATFORM"] = "cpu"
