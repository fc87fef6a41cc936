"""The examples of docs/vllm.md run and print what the page says.

Core's docs test runs every page, but skips this one where vLLM is not
installed; here it runs wherever vLLM is (``nox -s vllm``), outside the checkout it skips.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (nox -s vllm installs it)")

REPO = Path(__file__).resolve().parents[3]
CORE_DOCS_TEST = REPO / "packages" / "vllm-ir-core" / "tests" / "test_docs_examples.py"
PAGE = REPO / "docs" / "vllm.md"


def _platform_refusal() -> str | None:
    """Why vLLM refuses to build a config on this machine, if it does.

    vLLM 0.34's CPU platform requires triton-cpu on x86 (0.33 warns), which
    vLLM's CPU builds ship and no package index has; the page's example builds
    a ``VllmConfig`` in a fresh process. ``test_vllm.py`` runs the same calls
    with vLLM's Triton check satisfied.
    """
    from vllm.config import VllmConfig

    try:
        VllmConfig()
    except RuntimeError as e:
        if "triton" not in str(e).lower():
            raise
        return str(e)
    return None


def test_vllm_page_examples(tmp_path: Path) -> None:
    if not CORE_DOCS_TEST.is_file() or not PAGE.is_file():
        pytest.skip("not in the repository checkout")
    refusal = _platform_refusal()
    if refusal is not None:
        pytest.skip(f"vLLM refuses this machine: {refusal}")
    # run as a script: core's docs-test module, not importable from here
    examples = runpy.run_path(str(CORE_DOCS_TEST), run_name="core_docs_examples")
    examples["test_page_examples"](PAGE, tmp_path)
