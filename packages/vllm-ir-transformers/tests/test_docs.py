"""The examples of docs/transformers.md run and print what the page says.

Core's docs test runs every page, but skips this one where transformers is not
installed; here it always runs (the page is skipped only outside the checkout).
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CORE_DOCS_TEST = REPO / "packages" / "vllm-ir-core" / "tests" / "test_docs_examples.py"
PAGE = REPO / "docs" / "transformers.md"


def test_transformers_page_examples(tmp_path: Path) -> None:
    if not CORE_DOCS_TEST.is_file() or not PAGE.is_file():
        pytest.skip("not in the repository checkout")
    # run as a script: core's docs-test module, not importable from here
    examples = runpy.run_path(str(CORE_DOCS_TEST), run_name="core_docs_examples")
    examples["test_page_examples"](PAGE, tmp_path)
