"""The layering of core: one selection rule, the provider contract, no import cycles."""

from __future__ import annotations

import ast
import configparser
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import vllm_ir as ir
from torch import Tensor
from vllm_ir import selection as dispatch

ROOT = Path(__file__).resolve().parents[3]
CORE_SRC = ROOT / "packages" / "vllm-ir-core" / "src"


def _register(op: ir.IrOp, provider: str, *, accepts: bool = True, **kwargs: object) -> None:
    def impl(x: Tensor, factor: float) -> Tensor:
        return x * factor

    op.register_impl(provider, supports_args=lambda x, factor: accepts, **kwargs)(impl)  # type: ignore[arg-type]


# -- one selection rule ----------------------------------------------------------


def test_candidates_decide_on_every_impl(scale_op: ir.IrOp) -> None:
    _register(scale_op, "first", accepts=False)
    _register(scale_op, "second")
    _register(scale_op, "third")
    _register(scale_op, "unlisted")
    x = torch.ones(3)
    with scale_op.set_priority(["first", "second", "third"]):
        found = scale_op.candidates(x, 2.0)
        selection = scale_op.select(x, 2.0)
    by_name = {d.provider: d for d in found}
    assert by_name["first"].reason == "arguments not supported (supports_args returned False)"
    assert (by_name["second"].accepted, by_name["second"].reason) == (True, "selected")
    # select() stops at "second"; candidates() goes on, and past the list
    assert (by_name["third"].accepted, by_name["third"].reason) == (True, "accepts")
    assert not by_name["unlisted"].listed
    assert by_name["unlisted"].accepted
    assert found.selected.provider == selection.impl.provider == "second"
    assert [d.provider for d in selection.decisions] == ["first", "second"]
    assert found.accepted() == ["second", "third", "native", "unlisted"]
    assert "second" in found
    assert "nope" not in found
    with pytest.raises(KeyError, match="no impl or priority entry 'nope'"):
        found["nope"]


def test_candidates_honour_batch_invariance(
    scale_op: ir.IrOp, monkeypatch: pytest.MonkeyPatch
) -> None:
    _register(scale_op, "fast")
    _register(scale_op, "stable", batch_invariant=True)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    dispatch.invalidate_caches()
    x = torch.ones(3)
    with scale_op.set_priority(["fast", "stable"]):
        found = scale_op.candidates(x, 2.0)
        assert found["fast"].reason == "not batch invariant (VLLM_BATCH_INVARIANT=1)"
        assert found.selected.provider == "stable" == scale_op.selected_impl(x, 2.0).provider


def test_bench_times_only_what_selection_accepts(
    scale_op: ir.IrOp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``vllm-ir bench`` used to time impls that VLLM_BATCH_INVARIANT rules out."""
    from vllm_ir._cli.bench import _candidates

    _register(scale_op, "fast")
    _register(scale_op, "stable", batch_invariant=True)
    _register(scale_op, "declines", accepts=False)
    call = (torch.ones(3), 2.0)
    assert sorted(_candidates(scale_op, call)) == ["fast", "native", "stable"]
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    dispatch.invalidate_caches()
    assert sorted(_candidates(scale_op, call)) == ["native", "stable"]


def test_autotune_candidates_use_the_same_rule(
    scale_op: ir.IrOp, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_ir.compilation._autotune import candidates

    _register(scale_op, "fast")
    _register(scale_op, "declines", accepts=False)
    call = (torch.ones(3), 2.0)
    with scale_op.set_priority(["declines", "fast"]):
        assert [i.provider for i in candidates(scale_op, call, "eager")] == ["fast", "native"]
        monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
        dispatch.invalidate_caches()
        assert [i.provider for i in candidates(scale_op, call, "eager")] == ["native"]


def test_public_read_only_members(inplace_op: ir.IrOp) -> None:
    assert inplace_op.activation_indices == frozenset({0, 1})
    x = torch.ones(2, 4)
    assert inplace_op.selection_key(x, x) == inplace_op.selection_key(x.clone(), x.clone())
    assert inplace_op.has_input_generator is False
    assert ir.ops.rms_norm.has_input_generator is True
    assert set(inplace_op.registered_impls) == {"native", "writes_inputs"}


# -- configuration below compilation ---------------------------------------------


def test_backend_from_config_and_the_deprecated_shim() -> None:
    config = ir.KernelConfig(ir_op_priority={"rms_norm": ["native"]}, autotune=True)
    backend = ir.VllmIRBackend.from_config(config)
    assert backend.autotuner is not None
    assert backend.autotuner.margin == config.autotune_margin
    assert backend.lowering_pass.priorities["rms_norm"] == ("native",)
    with pytest.warns(DeprecationWarning, match="VllmIRBackend.from_config"):
        old = config.backend()
    assert type(old) is type(backend)
    assert old.autotuner is not None


def test_one_list_of_builtin_passes() -> None:
    from vllm_ir.compilation import _backend as backend
    from vllm_ir_cli import flags

    assert set(backend._BUILTIN_PASSES) == set(flags.BUILTIN_PASSES)
    assert ir.IrPassConfig().enabled() == [n for n, on in flags.BUILTIN_PASSES.items() if on]


# -- the provider contract ---------------------------------------------------------


def test_norm_supports_args() -> None:
    from vllm_ir.kits.norms import norm_supports_args
    from vllm_ir.provider import contiguous

    rms, fused = norm_supports_args(
        ("cpu",), (torch.float32,), fused_layout=lambda x, r: contiguous(x) and contiguous(r)
    )
    x, w = torch.randn(4, 8), torch.ones(8)
    assert rms(x, w, 1e-6)
    assert rms(x, None, 1e-6)
    assert not rms(x, w.half(), 1e-6)
    assert not rms(x, torch.ones(2, 4), 1e-6)
    assert not rms(x, w, 1e-6, 4)
    assert fused(x, torch.randn(4, 8), w, 1e-6)
    assert not fused(x, torch.randn(8, 4).t(), w, 1e-6)
    assert not fused(x, torch.randn(4, 8).half(), w, 1e-6)
    assert not fused(x, torch.randn(32), w, 1e-6)
    gate = [False]
    rms, _ = norm_supports_args("cpu", (torch.float32,), available=lambda: gate[0])
    assert not rms(x, w, 1e-6)
    gate[0] = True
    assert rms(x, w, 1e-6)


def test_vendor_norm_wiring() -> None:
    from vllm_ir.kits.vendor import VendorNorm
    from vllm_ir.provider import contiguous

    kit = VendorNorm(
        provider="acme",
        library="ACME",
        lacks="ACME does not support",
        dtypes=(torch.float32,),
        fused_layout=lambda x, r: contiguous(x),
    )
    x = torch.randn(2, 4)
    assert torch.equal(kit.weight(None, x), torch.ones(4))
    with pytest.raises(ValueError, match="acme impl of rms_norm got variance_size=2, which ACME"):
        kit.no_variance_size("rms_norm", 2)
    rms, fused = kit.supports_args_for("cpu")
    assert rms(x, None, 1e-6)
    assert not rms(x.t(), None, 1e-6)
    assert fused(x, x.clone(), None, 1e-6)
    assert not fused(x.t(), x.t(), None, 1e-6)


CORE = CORE_SRC / "vllm_ir"


def _core_modules() -> set[str]:
    """The top-level names of core: its folders (layers) and top-level modules."""
    names = set()
    for path in CORE.iterdir():
        if path.name.startswith("__") or path.name == "py.typed":
            continue
        names.add(path.name.removesuffix(".py"))
    return names


def _folder_modules(folder: str) -> set[str]:
    return {p.stem for p in (CORE / folder).glob("*.py") if p.name != "__init__.py"}


def _importlinter() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    return config


def _forbidden(contract: str) -> set[str]:
    lines = _importlinter()[f"importlinter:contract:{contract}"]["forbidden_modules"].split()
    return {line.removeprefix("vllm_ir.") for line in lines}


def test_import_contract_names_every_core_module() -> None:
    """A new top-level module or folder of core must be placed: allowed to providers, or not."""
    forbidden = _forbidden("providers")
    allowed = {"ops", "provider", "testing", "kits"}
    assert _core_modules() - forbidden == allowed
    assert _forbidden("transformers") == forbidden - {"compilation"}
    assert _forbidden("vllm-plugin") == forbidden - {"compilation"}


def test_no_import_cycles_in_core() -> None:
    """Counting imports inside functions and ``importlib.import_module``
    (tools/import_cycles.py), over core and its torch-free command-line front end."""
    tool = ROOT / "tools" / "import_cycles.py"
    done = subprocess.run(
        [sys.executable, str(tool), str(CORE_SRC), "vllm_ir", "vllm_ir_cli"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 cycles" in done.stdout


def _import_targets(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of each ``vllm_ir`` import in a file, at any depth."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "vllm_ir":  # ``from vllm_ir import x``: a module when x is one
                for a in node.names:
                    is_module = a.name in _core_modules()
                    yield node.lineno, f"vllm_ir.{a.name}" if is_module else "vllm_ir"
            else:
                yield node.lineno, node.module


def _outside_contract(path: Path, allowed: set[str]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for line, module in _import_targets(path)
        if module.split(".")[0] == "vllm_ir"
        and module != "vllm_ir"
        and not any(module == a or module.startswith(f"{a}.") for a in allowed)
    ]


CONTRACT = {"vllm_ir.provider", "vllm_ir.ops", "vllm_ir.testing", "vllm_ir.kits"}


def test_packages_and_their_tests_import_only_the_contract() -> None:
    """What lint-imports does not read: the other packages' tests, examples and
    the integration tests import only the contract (the transformers and vLLM
    integrations may also use ``vllm_ir.compilation``)."""
    folders = [p for p in (ROOT / "packages").iterdir() if p.name != "vllm-ir-core"]
    found = []
    for folder in [*folders, ROOT / "integration-tests"]:
        allowed = set(CONTRACT)
        if folder.name in ("vllm-ir-transformers", "vllm-ir-vllm", "integration-tests"):
            allowed.add("vllm_ir.compilation")
        for path in sorted(folder.rglob("*.py")):
            if not {".nox", "build", ".venv"} & set(path.parts):
                found += _outside_contract(path, allowed)
    assert not found, found


def test_the_contract_scan_finds_a_reach_in(tmp_path: Path) -> None:
    path = ROOT / "packages" / "vllm-ir-cpu" / "tests" / "_layering_probe.py"
    try:
        path.write_text("def f():\n    from vllm_ir._selection import selector\n")
        assert _outside_contract(path, CONTRACT) == [
            f"{path.relative_to(ROOT)}:2 imports vllm_ir._selection"
        ]
        path.write_text("from vllm_ir import priority, ops\nimport vllm_ir.kits.norms\n")
        assert _outside_contract(path, CONTRACT) == [
            f"{path.relative_to(ROOT)}:1 imports vllm_ir.priority"
        ]
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.skipif(shutil.which("lint-imports") is None, reason="import-linter not installed")
def test_import_linter_reads_the_tests_beside_the_packages() -> None:
    """``tools/lint_test_imports.py`` (``nox -s lint``) runs import-linter over the
    folders the contract scan above reads; a reach-in breaks its contract."""
    tool = [sys.executable, str(ROOT / "tools" / "lint_test_imports.py"), str(ROOT)]
    done = subprocess.run(tool, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "vllm-ir-cpu (tests, benchmarks, examples) imports only core's contract KEPT" in (
        done.stdout
    )
    path = ROOT / "packages" / "vllm-ir-cpu" / "tests" / "_layering_probe.py"
    for text in ("from vllm_ir import priority\n", "def f():\n    import vllm_ir._op.op\n"):
        try:
            path.write_text(text)
            done = subprocess.run(tool, capture_output=True, text=True)
        finally:
            path.unlink(missing_ok=True)
        assert done.returncode != 0, text
        assert "vllm-ir-cpu (tests, benchmarks, examples) imports only core's contract BROKEN" in (
            done.stdout
        )
        assert "_layering_probe" in done.stdout


# -- shared test helpers ---------------------------------------------------------


def test_isolated_resets_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm_ir.priority import process_priorities
    from vllm_ir.testing import isolated

    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    ir.IrOpPriorityConfig(rms_norm=["native"]).apply()
    before = dispatch.generation()
    with isolated():
        assert "VLLM_BATCH_INVARIANT" not in os.environ
        assert dict(process_priorities()) == {}
        assert dispatch.generation() > before
    assert dict(process_priorities()) == {"rms_norm": ("native",)}
    assert os.environ["VLLM_BATCH_INVARIANT"] == "1"


PLUGIN = "vllm_ir.testing.pytest_plugin"


def test_pytest_plugin_fixture(tmp_path: Path) -> None:
    """The plugin's fixture, loaded as the pytest11 entry point loads it (by module name)."""
    (tmp_path / "test_uses_plugin.py").write_text(
        "import os\n"
        "from vllm_ir.priority import process_priorities\n"
        "def test_clean(vllm_ir_isolated):\n"
        "    assert 'VLLM_IR_PLATFORM' not in os.environ\n"
        "    assert dict(process_priorities()) == {}\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            PLUGIN,
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        # only the -p load: where the package is installed, its pytest11 entry
        # point would register the same module a second time
        env={**os.environ, "VLLM_IR_PLATFORM": "cpu", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_tiny_decoder_is_reproducible() -> None:
    from vllm_ir.testing import TinyDecoder

    x = torch.randn(3, 16)
    a, b = TinyDecoder(16, 2), TinyDecoder(16, 2)
    plain = TinyDecoder(16, 2, use_ir=False)
    with torch.no_grad():
        torch.testing.assert_close(a(x.clone()), b(x.clone()))
        torch.testing.assert_close(a(x.clone()), plain(x.clone()))


def test_compile_agrees() -> None:
    from vllm_ir.testing import TinyDecoder, compile_agrees

    priority = {"rms_norm": ["native"], "fused_add_rms_norm": ["native"]}
    backend = compile_agrees(TinyDecoder(16, 1).eval(), priority, torch.randn(4, 16))
    assert backend.lowering_pass.selected_impls["rms_norm"] == {"rms_norm": "native"}
    assert not backend.pass_contexts[0].from_cache


def _module_map() -> list[tuple[str, list[str]]]:
    """docs/design.md's module map, bottom first: (layer, backquoted names of its row)."""
    text = (ROOT / "docs" / "design.md").read_text()
    table = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    rows = []
    for row in table.splitlines():
        if row.startswith("| ") and not row.startswith("| Layer"):
            cells = row.split("|")
            rows.append((cells[1].strip(), re.findall(r"`([^`]+)`", cells[2])))
    return rows


def _row_of_top_level() -> dict[str, int]:
    """Each top-level module or folder named in the map -> its row."""
    top = _core_modules() | {"__main__"}
    return {
        name.strip("/"): i
        for i, (_, names) in enumerate(_module_map())
        for name in names
        if name.strip("/") in top
    }


def test_design_module_map_names_every_module() -> None:
    """docs/design.md's module map matches the code: every folder and top-level
    module is placed, and every module of a folder is named in the folder's row."""
    rows = _row_of_top_level()
    missing = _core_modules() - set(rows)
    assert not missing, f"missing from docs/design.md's module map: {sorted(missing)}"
    folders = sorted(p.name for p in CORE.iterdir() if (p / "__init__.py").exists())
    for folder in folders:
        named = set(_module_map()[rows[folder]][1])
        absent = _folder_modules(folder) - named
        assert not absent, f"{folder}/ modules missing from its row of the map: {sorted(absent)}"


def test_the_layers_contract_follows_the_module_map() -> None:
    """``core-layers`` in .importlinter lists the map's layers, in its order (top first)."""
    layers = _importlinter()["importlinter:contract:core-layers"]["layers"].split("\n")
    contract = [{n.strip() for n in line.split(":")} for line in layers if line.strip()]
    rows = _row_of_top_level()
    by_row: dict[int, set[str]] = {}
    for name, row in rows.items():
        by_row.setdefault(row, set()).add(name)
    assert contract == [by_row[i] for i in sorted(by_row, reverse=True)]


def test_imports_follow_the_module_map_layers() -> None:
    """No module of core imports from a layer after its own in docs/design.md."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from import_cycles import import_graph
    finally:
        sys.path.pop(0)
    layers, rows = _module_map(), _row_of_top_level()

    def layer(module: str) -> int:
        parts = module.split(".")[1:]
        return rows[parts[0]] if parts else len(layers) - 1  # vllm_ir/__init__: the surface

    upward = [
        f"{m} ({layers[layer(m)][0]}) imports {t} ({layers[layer(t)][0]})"
        for m, targets in import_graph(CORE_SRC, "vllm_ir").items()
        for t in targets
        if layer(t) > layer(m)
    ]
    assert not upward, upward
