"""Internal modules are private by name; their old import paths still work for one release."""

from __future__ import annotations

import importlib
import logging
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import vllm_ir
from vllm_ir._base import moved_modules as _moved_modules

SRC = Path(vllm_ir.__file__).parent
PUBLIC = {
    "ops",
    "provider",
    "kits",
    "testing",
    "compilation",
    "priority",
    "selection",
    "config",
    "envs",
}
"""Core's public modules: everything else at the top of the package is internal."""


def test_only_the_public_modules_have_public_names() -> None:
    names = {p.name.removesuffix(".py") for p in SRC.iterdir() if p.name != "py.typed"}
    public = {n for n in names if not n.startswith("_")}
    assert public == PUBLIC
    compilation = {p.stem for p in (SRC / "compilation").glob("[!_]*.py")}
    assert compilation == {"ir_nodes"}


@pytest.mark.parametrize("old", [*sorted(_moved_modules.MOVED), "vllm_ir.cli.args"])
def test_an_old_path_imports_the_same_module_with_a_warning(old: str) -> None:
    new = _moved_modules.new_name(old)
    assert new is not None
    importlib.import_module(new)
    sys.modules.pop(old, None)
    # a submodule's old path may warn for its old parent package too, first, unless an
    # earlier test in this process imported the parent: record them all
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any(m.startswith(f"{old} is deprecated: import {new}") for m in messages), messages
    assert module is sys.modules[new]  # one module: a patch through either name is seen by both


def test_importing_an_old_path_leaves_the_modules_own_spec() -> None:
    """The import system sets the alias's spec on the module the alias returns:
    put back, or importlib.reload() renames the module and runs nothing
    (reliability-v4 13). In a fresh process: a reload here would replace the
    classes other tests hold."""
    code = (
        "import importlib, warnings\n"
        "import vllm_ir._base.timing as new\n"
        "warnings.simplefilter('ignore')\n"
        "import vllm_ir.timing\n"
        "before = new.time_call\n"
        "print(new.__spec__.name, importlib.reload(new).__name__, new.time_call is not before)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["vllm_ir._base.timing", "vllm_ir._base.timing", "True"]


def test_the_old_attribute_of_the_package_warns_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(vllm_ir.__dict__, "op", raising=False)  # as before any import of it
    with pytest.warns(DeprecationWarning, match="vllm_ir.op is deprecated"):
        assert vllm_ir.op is vllm_ir._op.op  # type: ignore[attr-defined]


def test_unmoved_names_are_left_to_the_import_system() -> None:
    assert _moved_modules.new_name("vllm_ir.ops") is None
    assert _moved_modules.new_name("vllm_ir.client") is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("vllm_ir.no_such_module")


def test_loggers_keep_their_public_names() -> None:
    from vllm_ir._base.logger import get_logger

    assert get_logger("vllm_ir._discovery.providers") is logging.getLogger("vllm_ir.providers")
    assert get_logger("vllm_ir.compilation._backend").name == "vllm_ir.compilation.backend"
    assert get_logger("vllm_ir._cli.tune").name == "vllm_ir.cli.tune"
    # only renamed modules: a provider's private module or an always-private one keeps its name
    assert get_logger("my_kernels._impls").name == "my_kernels._impls"
    assert get_logger("vllm_ir._selection.hotpath").name == "vllm_ir._selection.hotpath"
    assert get_logger("vllm_ir.selection").name == "vllm_ir.selection"


def test_the_old_paths_work_in_a_fresh_process() -> None:
    """First thing in a process, as an old script would: no prior import of the new names."""
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n    from vllm_ir.op import IrOp\nexcept DeprecationWarning as e:\n    print(e)\n"
        "warnings.simplefilter('ignore')\n"
        "from vllm_ir.op import IrOp\nfrom vllm_ir._op.op import IrOp as New\nprint(IrOp is New)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == [_moved_modules.message("vllm_ir.op"), "True"]


def test_the_selection_check_has_a_public_home() -> None:
    """Documented for users (VLLM_IR_CHECK_SELECTION at run time): served by vllm_ir.testing."""
    from vllm_ir import testing
    from vllm_ir._selection import eager as _eager

    assert testing.set_selection_check is _eager.set_selection_check
    assert testing.SelectionMismatch is _eager.SelectionMismatch


@pytest.mark.parametrize(
    ("name", "kit"),
    [
        ("VendorNorm", "vllm_ir.kits.vendor"),
        ("norm_supports_args", "vllm_ir.kits.norms"),
        ("NORM_TOLERANCES", "vllm_ir.kits.norms"),
        ("fp8_steps_apart", "vllm_ir.kits.quant"),
    ],
)
def test_kit_names_left_the_provider_contract(name: str, kit: str) -> None:
    """Served by vllm_ir.provider for one release, with a warning naming the kit."""
    import importlib

    import vllm_ir.provider

    assert name not in vllm_ir.provider.__all__
    with pytest.warns(DeprecationWarning, match=f"import it from {kit}"):
        old = getattr(vllm_ir.provider, name)
    assert old is getattr(importlib.import_module(kit), name)
    assert name in importlib.import_module(kit).__all__
