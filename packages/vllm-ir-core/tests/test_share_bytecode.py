"""tools/share_bytecode.py, which CI's sessions use: only bytecode of the very same
source file crosses venvs, and it imports as the target's own module."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))
from share_bytecode import share  # noqa: E402


def _site(venv: Path) -> Path:
    site = venv / "lib" / "python3.11" / "site-packages" / "pkg"
    site.mkdir(parents=True)
    return site


def test_links_bytecode_of_shared_sources_only(tmp_path: Path) -> None:
    donor, target = _site(tmp_path / "donor"), _site(tmp_path / "target")
    (donor / "linked.py").write_text("def where():\n    return __file__\n")
    os.link(donor / "linked.py", target / "linked.py")  # as uv installs from its cache
    (donor / "copied.py").write_text("X = 1\n")
    (target / "copied.py").write_text("X = 1\n")  # same text, another file
    for module in ("linked", "copied"):
        py_compile.compile(str(donor / f"{module}.py"))
    (donor / "__pycache__" / "copied.cpython-311.pyc.1234").write_bytes(b"")  # a temporary

    assert share(tmp_path / "target", [tmp_path / "donor", tmp_path / "target"]) == 1
    linked = next((target / "__pycache__").glob("linked.*.pyc"))
    assert linked.stat().st_ino == next((donor / "__pycache__").glob("linked.*.pyc")).stat().st_ino
    assert sorted(p.name.split(".")[0] for p in (target / "__pycache__").iterdir()) == ["linked"]
    assert share(tmp_path / "target", [tmp_path / "donor"]) == 0  # already there

    # it is valid there: importing the target's module keeps it (a stale one is rewritten)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    where = subprocess.run(
        [sys.executable, "-c", "import pkg.linked as m; print(m.where())"],
        cwd=target.parent,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where == str(target / "linked.py")
    assert linked.stat().st_nlink == 2, "importlib rewrote the shared bytecode"


def test_a_venv_without_site_packages_gets_nothing(tmp_path: Path) -> None:
    _site(tmp_path / "donor")
    assert share(tmp_path / "empty", [tmp_path / "donor"]) == 0
