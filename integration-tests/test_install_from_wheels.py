"""The README's install recipe, on a fresh virtual environment.

Until the packages are on a package index, users build the wheels (``nox -s
build`` writes them to ``.cache/dist``) and install from that folder::

    pip install --find-links .cache/dist vllm-ir-core vllm-ir-cpu

This runs exactly that against the wheels ``nox -s integration`` built
(``VLLM_IR_WHEEL_DIR``), in a new venv that has nothing installed: core and a
provider must resolve from the folder (the index has neither), torch from the
index as for a user (pinned by ``constraints.txt``, so pip's cache serves the
wheel the session already downloaded), and the installed command must find
the provider.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.slow,  # a venv and torch's wheel unpacked: about a minute
    pytest.mark.skipif("VLLM_IR_WHEEL_DIR" not in os.environ, reason="set by nox -s integration"),
]


def _wheel_versions(dist: Path) -> dict[str, str]:
    """Distribution name -> version, from the wheel file names in ``dist``."""
    versions = {}
    for wheel in dist.glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        versions[name.replace("_", "-")] = version
    return versions


def _clean_env(venv: Path) -> dict[str, str]:
    """The environment of a user's shell with ``venv`` activated: nothing of ours leaks in."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_FIND_LINKS")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("VLLM_")}
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VLLM_IR_CACHE_DIR"] = str(venv / "vllm_ir_cache")  # a fresh, private build cache
    return env


def _run(args: list[str], env: dict[str, str], timeout: int) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args)}: exit {proc.returncode}\n{proc.stderr[-4000:]}"
    return proc


def test_the_readme_recipe_installs_core_and_a_provider_from_the_wheels(tmp_path: Path) -> None:
    dist = Path(os.environ["VLLM_IR_WHEEL_DIR"])
    built = _wheel_versions(dist)
    assert {"vllm-ir-core", "vllm-ir-cpu"} <= set(built), sorted(built)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    env = _clean_env(venv)
    # the recipe of README.md and docs/provider-author-guide.md; --no-compile installs
    # the same files without precompiling all of torch's bytecode (~15 s of CPU, and
    # the two commands below import a small part of it)
    _run(
        [
            *(python, "-m", "pip", "install", "--no-compile", "--find-links", str(dist)),
            *("-c", str(REPO / "constraints.txt"), "vllm-ir-core", "vllm-ir-cpu"),
        ],
        env,
        timeout=1200,
    )
    probe = (
        "import json, importlib.metadata as m, vllm_ir, vllm_ir_cpu\n"
        "print(json.dumps({'core': m.version('vllm-ir-core'), 'cpu': m.version('vllm-ir-cpu'),"
        " 'files': [vllm_ir.__file__, vllm_ir_cpu.__file__]}))\n"
    )
    found = json.loads(_run([python, "-c", probe], env, timeout=300).stdout.splitlines()[-1])
    assert (found["core"], found["cpu"]) == (built["vllm-ir-core"], built["vllm-ir-cpu"])
    for path in found["files"]:  # from the new venv's site-packages, not this checkout
        assert Path(path).resolve().is_relative_to(venv.resolve()), path
    ops = json.loads(_run([str(venv / "bin" / "vllm-ir"), "ops", "--json"], env, 600).stdout)
    providers = {(row["op"], row["provider"]) for row in ops["impls"]}
    assert ("rms_norm", "cpu_c") in providers, ops
    assert "cpu_c" not in ops["failed_providers"], ops["failed_providers"]
