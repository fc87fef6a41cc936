"""The command-line samples of ``docs/`` print what the pages show.

A sample is a fenced ``text`` or ``console`` block whose lines start with
``$ vllm-ir ...``; the lines after each command, up to the next, are its
output. The test runs each command (the environment of this package's tests:
core and ``cpu_c`` installed, no ``VLLM_*`` variables, in a temporary
directory holding a ``tuned.json`` that is not a plan) and checks that every
shown line appears in its output, in order, spaces collapsed; a ``...`` line
stands for any number of lines. A command shown without output is not run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[3] / "docs"
PAGES = ("cli.md", "compile.md", "model-author-guide.md")
_FENCE = re.compile(r"^```(text|console)\n(.*?)^```", re.M | re.S)


def _samples() -> list[tuple[str, str, list[str]]]:
    """``(where, command, shown output lines)`` of every sample with output."""
    found = []
    for page in PAGES:
        path = DOCS / page
        if not path.exists():
            continue
        text = path.read_text()
        for block in _FENCE.finditer(text):
            line = text.count("\n", 0, block.start()) + 1
            command, shown = None, []
            for row in [*block.group(2).splitlines(), "$ end"]:
                if row.startswith("$ "):
                    if command is not None and shown and command.startswith("vllm-ir "):
                        found.append((f"{page}:{line}", command, shown))
                    command, shown = row[2:], []
                elif command is not None:
                    shown.append(row)
    return found


def _normal(line: str) -> str:
    return " ".join(line.split())


def _missing(shown: list[str], output: list[str]) -> str | None:
    """The first shown line not found in ``output`` after the previous one, or None."""
    lines = [_normal(o) for o in output]
    at = 0
    for want in shown:
        if want.strip() == "...":
            continue
        want = _normal(want)
        try:
            at = lines.index(want, at) + 1
        except ValueError:
            return want
    return None


SAMPLES = _samples()


@pytest.mark.skipif(not SAMPLES, reason="no docs/ beside the package (an sdist)")
@pytest.mark.parametrize(("where", "command", "shown"), SAMPLES, ids=[s[0] for s in SAMPLES])
def test_the_page_shows_what_the_command_prints(
    kernels: Path, tmp_path: Path, where: str, command: str, shown: list[str]
) -> None:
    (tmp_path / "tuned.json").write_text(json.dumps({"ir_op_priority": {"rms_norm": ["native"]}}))
    # the kernels' build cache is kept; every other VLLM_ setting is not
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update({k: v for k, v in os.environ.items() if k == "VLLM_IR_CACHE_DIR"})
    argv = shlex.split(command.split("  #")[0])
    result = subprocess.run(
        [sys.executable, "-m", "vllm_ir_cli", *argv[1:]],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    output = (result.stdout + result.stderr).splitlines()
    missing = _missing(shown, output)
    assert missing is None, (
        f"{where}: `{command}` does not print {missing!r}; it printed:\n" + "\n".join(output)
    )
