"""The torch versions the project declares are the ones CI tests.

``noxfile.TORCH_VERSIONS`` is the matrix (``constraints.txt``'s pin runs every
session, the others ``torch_matrix``, which CI runs through
``tools/ci_lanes.py``); core's ``torch>=`` bound must be its oldest entry.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[3]


def _matrix() -> tuple[str, ...]:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "TORCH_VERSIONS" for t in node.targets
        ):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("noxfile.py defines no TORCH_VERSIONS")


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def test_core_requires_the_oldest_tested_torch() -> None:
    pyproject = tomllib.loads((ROOT / "packages" / "vllm-ir-core" / "pyproject.toml").read_text())
    (bound,) = [d for d in pyproject["project"]["dependencies"] if d.startswith("torch")]
    match = re.fullmatch(r"torch>=(\d+\.\d+)(\.\d+)?", bound)
    assert match, f"core's torch requirement {bound!r} is not a plain lower bound"
    matrix = _matrix()
    assert list(matrix) == sorted(matrix, key=lambda v: tuple(map(int, v.split(".")))), matrix
    assert _minor(match.group(1)) == _minor(matrix[0]), (bound, matrix)


def test_the_pinned_torch_is_in_the_matrix() -> None:
    pins = re.findall(r"^torch==(\S+)$", (ROOT / "constraints.txt").read_text(), re.MULTILINE)
    assert pins
    assert pins[0] in _matrix()


def test_ci_runs_every_other_version() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import ci_lanes
    finally:
        sys.path.remove(str(ROOT / "tools"))
    pinned = re.findall(r"^torch==(\S+)$", (ROOT / "constraints.txt").read_text(), re.MULTILINE)
    others = [f"torch_matrix(version='{v}')" for v in _matrix() if v not in pinned]
    assert ci_lanes.extra_sessions([*others, "bench", "fuzz"]) == others
