"""The Python examples of the pages in ``docs/`` run, and print what the pages say.

Each page is one test. Its fenced ```` ```python ```` blocks run in order, in one
fresh interpreter (``sys.executable``, a temporary directory as the working
directory), as one script: later blocks use what earlier ones defined. The
test fails if a block raises; the traceback names the page and its line.

Expected output: comment lines *directly* after a ``print(...)`` statement
(no blank line between) are what that statement prints, one comment line per
printed line, without the leading ``# ``. A ``print`` inside a loop collects
everything it prints in the loop::

    print(ir.ops.rms_norm.get_priority())
    # ['native']
    for d in selection.decisions:
        print(d.entry.provider, d.accepted)
    # guide_fast False
    # native True

Do not put an ordinary comment right after a ``print``: leave a blank line.

A block that cannot run as part of its page (say, a snippet that needs a
package built on disk) is skipped with this HTML comment, invisible once
rendered, as the nearest non-blank line before its fence::

    <!-- docs-test: skip -->

Use it sparingly: a skipped example is not tested at all. A page about a
package other than core names the modules its examples import with
``<!-- docs-test: requires vllm_ir_transformers, transformers -->``; it is
skipped where they are not installed (that package's tests run it). Blocks in other
languages (``text``, ``toml``, ``console`` ...) are never run.

``VLLM_*`` environment variables are removed and ``VLLM_IR_PROVIDERS=none``
is set: the pages assume a default environment with only core installed.
Without the repository's ``docs/`` (the package tested from an sdist), the
page tests skip.
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import pytest

DOCS = Path(__file__).resolve().parents[3] / "docs"
SKIP_MARKER = "<!-- docs-test: skip -->"
_REQUIRES = re.compile(r"<!--\s*docs-test:\s*requires\s+(?P<modules>[\w., ]+?)\s*-->")
_DIRECTIVE = re.compile(r"<!--\s*docs-test\b.*?-->")
_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*)$")
PYTHON_INFO = {"python", "py"}
_PRINT_HOOK = "__docs_test_print__"


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line in the page of the block's first code line
    code: str
    skipped: bool


def extract_python_blocks(text: str) -> list[Block]:
    """The ```python blocks of a Markdown page, in order, dedented to their fence."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    previous = ""  # the last non-blank line outside fences
    while i < len(lines):
        match = _FENCE_OPEN.match(lines[i])
        if match is None:
            if lines[i].strip():
                previous = lines[i].strip()
                directive = _DIRECTIVE.search(previous)
                if (
                    directive
                    and directive.group(0) != SKIP_MARKER
                    and not _REQUIRES.fullmatch(directive.group(0))
                ):
                    raise ValueError(
                        f"line {i + 1}: unknown docs-test directive {directive.group(0)!r}; "
                        f"known: {SKIP_MARKER!r}, '<!-- docs-test: requires MODULE, ... -->'"
                    )
            i += 1
            continue
        indent, fence = len(match["indent"]), match["fence"]
        language = (match["info"].split() or [""])[0].lower()
        start = i + 1
        i = start
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped.startswith(fence) and set(stripped) == {fence[0]}:
                break
            i += 1
        else:
            raise ValueError(f"line {start}: unclosed code fence")
        if language in PYTHON_INFO:
            body = [
                line[indent:] if not line[:indent].strip() else line.lstrip()
                for line in lines[start:i]
            ]
            blocks.append(Block(start + 1, "\n".join(body) + "\n", previous == SKIP_MARKER))
        previous = ""
        i += 1
    return blocks


def expected_prints(code: str) -> dict[int, list[str]]:
    """``{line of a print statement: the lines it should print}``, lines 1-based in ``code``."""
    lines = code.splitlines()
    expected: dict[int, list[str]] = {}
    for node in ast.walk(ast.parse(code)):
        if not _is_print_statement(node):
            continue
        out = []
        for line in lines[node.end_lineno or node.lineno :]:
            stripped = line.strip()
            if not stripped.startswith("#"):
                break
            out.append(stripped[2:] if stripped.startswith("# ") else stripped[1:])
        if out:
            expected[node.lineno] = out
    return expected


def _is_print_statement(node: ast.AST) -> TypeGuard[ast.Expr]:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "print"
    )


class _HookPrints(ast.NodeTransformer):
    """``print(...)`` on the given lines becomes ``__docs_test_print__(line, ...)``."""

    def __init__(self, lines: set[int]) -> None:
        self.lines = lines

    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        self.generic_visit(node)
        if _is_print_statement(node) and node.lineno in self.lines:
            call = node.value
            assert isinstance(call, ast.Call)
            call.func = ast.copy_location(ast.Name(_PRINT_HOOK, ast.Load()), call.func)
            call.args.insert(0, ast.copy_location(ast.Constant(node.lineno), call.func))
        return node


def run_page(page: str, blocks: list[dict[str, Any]], results: str) -> None:
    """Subprocess side: run the blocks in one ``__main__`` namespace, record hooked prints."""
    printed: dict[int, str] = {}

    def hook(line: int, *args: Any, **kwargs: Any) -> None:
        buffer = io.StringIO()
        print(*args, **{**kwargs, "file": buffer})
        printed[line] = printed.get(line, "") + buffer.getvalue()
        target = kwargs.get("file") or sys.stdout
        target.write(buffer.getvalue())

    # Blocks compile with the page as their filename; Dynamo would read the
    # Markdown as Python source to name functions and fail on some pages.
    # An empty entry in its cache makes it skip that lookup.
    import torch._dynamo.funcname_cache as funcname_cache

    funcname_cache.cache[page] = {}
    main = types.ModuleType("__main__")
    main.__dict__[_PRINT_HOOK] = hook
    sys.modules["__main__"] = main
    checks = []
    for block in blocks:
        offset = block["line"] - 1
        expected = {offset + k: v for k, v in expected_prints(block["code"]).items()}
        tree = ast.parse(block["code"])
        ast.increment_lineno(tree, offset)
        tree = ast.fix_missing_locations(_HookPrints(set(expected)).visit(tree))
        # dont_inherit: not this file's `from __future__ import annotations`
        exec(compile(tree, page, "exec", dont_inherit=True), main.__dict__)
        checks += [{"line": k, "expected": v} for k, v in expected.items()]
    for check in checks:
        check["printed"] = printed.get(check["line"], "")
    Path(results).write_text(json.dumps(checks))


def _pages() -> list[Any]:
    # the checkout's docs/, not some docs/ that happens to sit above an unpacked sdist
    if not DOCS.is_dir() or not (DOCS.parent / "packages" / "vllm-ir-core").is_dir():
        reason = f"no repository docs/ folder at {DOCS} (tested outside the checkout?)"
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="no-docs")]
    pages = sorted(DOCS.rglob("*.md"))
    return [pytest.param(p, id=p.relative_to(DOCS).as_posix()) for p in pages]


@pytest.mark.parametrize("page", _pages())
@pytest.mark.slow
def test_page_examples(page: Path, tmp_path: Path) -> None:
    name = Path(os.path.relpath(page, DOCS.parent)).as_posix()  # docs/<page>.md
    text = page.read_text(encoding="utf-8")
    for match in _REQUIRES.finditer(text):
        for module in match["modules"].replace(",", " ").split():
            pytest.importorskip(module, reason=f"{name} needs {module}")
    blocks = extract_python_blocks(text)
    runnable = [{"line": b.line, "code": b.code} for b in blocks if not b.skipped]
    if not runnable:
        pytest.skip(f"{name} has no runnable python examples")
    (tmp_path / "blocks.json").write_text(json.dumps(runnable))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    # the pages describe core alone: providers installed beside it stay out
    env["VLLM_IR_PROVIDERS"] = "none"
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), str(page), "blocks.json", "results.json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        pytest.fail(
            f"the examples of {name} failed (exit code {proc.returncode})\n"
            f"--- stderr ---\n{proc.stderr}\n--- stdout ---\n{proc.stdout}",
            pytrace=False,
        )
    mismatches = []
    for check in json.loads((tmp_path / "results.json").read_text()):
        printed = [line.rstrip() for line in check["printed"].splitlines()]
        expected = [line.rstrip() for line in check["expected"]]
        if printed != expected:
            mismatches.append(
                f"{name}:{check['line']}: the print is documented as\n"
                + "".join(f"    # {line}\n" for line in expected)
                + "  but printed\n"
                + "".join(f"    {line}\n" for line in printed or ["(nothing)"])
            )
    if mismatches:
        pytest.fail("\n".join(mismatches), pytrace=False)


def test_extraction() -> None:
    """Fences (indented, nested in other fences, skipped) and expected output are read right."""
    page = "\n".join(
        [
            "Text.",
            "```python",
            "x = 1",
            "print(x)",
            "# 1",
            "```",
            "- item:",
            "",
            "  ```python",
            "  for i in range(2):",
            "      print(",
            "          i",
            "      )  # trailing note",
            "  # 0",
            "  # 1",
            "",
            "  print('no expected output')",
            "",
            "  # just a comment",
            "  ```",
            "````markdown",
            "```python",
            "raise AssertionError('inside another fence')",
            "```",
            "````",
            SKIP_MARKER,
            "",
            "```python",
            "import not_installed",
            "```",
            "```toml",
            "[project]",
            "```",
        ]
    )
    blocks = extract_python_blocks(page)
    assert [(b.line, b.skipped) for b in blocks] == [(3, False), (10, False), (29, True)]
    assert blocks[1].code.startswith("for i in range(2):\n    print(\n")
    assert expected_prints(blocks[0].code) == {2: ["1"]}
    assert expected_prints(blocks[1].code) == {2: ["0", "1"]}
    with pytest.raises(ValueError, match="unknown docs-test directive"):
        extract_python_blocks("<!-- docs-test: skp -->\n```python\npass\n```\n")


if __name__ == "__main__":
    # python test_docs_examples.py PAGE BLOCKS_JSON RESULTS_JSON, in the temporary directory
    sys.path[0] = os.getcwd()  # like `python script.py` there: not this tests/ folder
    _page, _blocks, _results = sys.argv[1:]
    run_page(_page, json.loads(Path(_blocks).read_text()), _results)
