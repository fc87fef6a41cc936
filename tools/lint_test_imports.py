"""import-linter over the code beside the packages: each provider package's tests,
benchmarks and examples, and the integration tests, use only core's contract.

``lint-imports`` reads importable packages; a ``tests/`` folder is not one. This
tool mirrors each such folder (symbolic links) as a package in a temporary
directory, writes one ``forbidden`` contract per folder — every module of
``vllm_ir`` outside the contract (``vllm_ir``, ``vllm_ir.provider``,
``vllm_ir.ops``, ``vllm_ir.testing``, ``vllm_ir.kits``; ``vllm_ir.compilation``
too for the transformers and vLLM integrations and the integration tests) — and
runs ``lint-imports`` on them. Core's own tests test its internals: not checked.

    python tools/lint_test_imports.py [REPO]      # exit status: lint-imports'
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

CONTRACT = ("provider", "ops", "testing", "kits")
"""``vllm_ir``'s public modules every package may import."""

WITH_COMPILATION = ("vllm-ir-transformers", "vllm-ir-vllm", "integration-tests")
"""Folders that may also import ``vllm_ir.compilation``."""

_SKIPPED = {".nox", "build", ".venv", "src", "__pycache__"}


def _core_modules(repo: Path) -> list[str]:
    """``vllm_ir``'s top-level modules and packages, by name."""
    core = repo / "packages" / "vllm-ir-core" / "src" / "vllm_ir"
    return sorted(
        p.stem if p.suffix == ".py" else p.name
        for p in core.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    )


def _mirror(folder: Path, package: Path) -> int:
    """Link ``folder``'s Python files into ``package`` (a package at every level)."""
    count = 0
    for path in sorted(folder.rglob("*.py")):
        relative = path.relative_to(folder)
        if _SKIPPED & set(relative.parts[:-1]) or relative.name == "__init__.py":
            continue
        target = package / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        for level in [target.parent, *target.parent.relative_to(package).parents]:
            (package / level if level != target.parent else level).joinpath("__init__.py").touch()
        target.symlink_to(path)
        count += 1
    return count


def config(repo: Path, root: Path) -> str:
    """Mirror the folders under ``root`` and return the import-linter configuration."""
    folders = [p for p in sorted((repo / "packages").iterdir()) if p.name != "vllm-ir-core"]
    folders.append(repo / "integration-tests")
    names, contracts = [], []
    modules = _core_modules(repo)
    for folder in folders:
        name = folder.name.replace("-", "_") + "_beside"
        if not _mirror(folder, root / name):
            continue
        allowed = {*CONTRACT, *(("compilation",) if folder.name in WITH_COMPILATION else ())}
        forbidden = "\n".join(f"    vllm_ir.{m}" for m in modules if m not in allowed)
        names.append(name)
        contracts.append(
            f"[importlinter:contract:{name}]\n"
            f"name = {folder.name} (tests, benchmarks, examples) imports only core's contract\n"
            f"type = forbidden\nsource_modules = {name}\nforbidden_modules =\n{forbidden}\n"
            "allow_indirect_imports = True\n"
        )
    roots = "\n".join(f"    {n}" for n in [*names, "vllm_ir"])
    head = f"[importlinter]\nroot_packages =\n{roots}\ninclude_external_packages = True\n"
    return "\n".join([head, *contracts])


def main(argv: list[str]) -> int:
    repo = Path(argv[0] if argv else Path(__file__).resolve().parents[1]).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / ".importlinter").write_text(config(repo, root))
        sources = [str(p) for p in sorted((repo / "packages").glob("*/src"))]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tmp, *sources])}
        done = subprocess.run(
            ["lint-imports", "--no-cache"],  # reads .importlinter in cwd
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
        )
        # the report names the mirrored packages: say which folder each is
        print(done.stdout.replace(tmp, "<mirror>"), end="")
        print(done.stderr, end="", file=sys.stderr)
        return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
