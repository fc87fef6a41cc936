"""The examples of docs/vllm.md run and print what the page says.

Core's docs test runs every page, but skips this one where vLLM is not
installed; here it runs wherever vLLM is (``nox -s vllm``), outside the checkout it skips.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (nox -s vllm installs it)")

REPO = Path(__file__).resolve().parents[3]
CORE_DOCS_TEST = REPO / "packages" / "vllm-ir-core" / "tests" / "test_docs_examples.py"
PAGE = REPO / "docs" / "vllm.md"


def test_vllm_page_examples(tmp_path: Path) -> None:
    if not CORE_DOCS_TEST.is_file() or not PAGE.is_file():
        pytest.skip("not in the repository checkout")
    import importlib.util

    spec = importlib.util.spec_from_file_location("core_docs_examples", CORE_DOCS_TEST)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(spec.name, None)
    module.test_page_examples(PAGE, tmp_path)
