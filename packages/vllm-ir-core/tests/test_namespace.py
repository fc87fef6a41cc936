"""The torch namespace of the IR ops beside a vLLM that ships ``vllm.ir``.

vLLM 0.32 to 0.34's ``vllm/ir/op.py`` defines ``vllm_ir::rms_norm`` and friends
at import. A stand-in package doing the same (no vLLM needed here) checks that
vllm-ir moves to :data:`vllm_ir._base.namespace.FALLBACK_NAMESPACE` and that both
import orders work; the real wheel is checked by ``nox -s vllm``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import vllm_ir as ir
from vllm_ir._base import namespace

# what vllm/ir of vLLM 0.33 and 0.34 does, reduced to the clashing part
_FAKE_VLLM_IR = """
import torch
from torch.library import Library
lib = Library("vllm_ir", "FRAGMENT")
lib.define(
    "rms_norm(Tensor x, Tensor? weight, float epsilon, SymInt? variance_size=None) -> Tensor"
)
lib.impl("rms_norm", lambda x, w, e, v=None: x * 2, "CompositeExplicitAutograd")
"""

_CHECK = """
import torch
x, w = torch.ones(2, 8), torch.ones(8)
{first}
{second}
assert torch.ops.vllm_ir.rms_norm(x, w, 1e-6).eq(2).all()  # the stand-in's op, untouched
torch.testing.assert_close(vllm_ir.ops.rms_norm(x, w, 1e-6), x)
assert vllm_ir.ops.rms_norm.torch_op is torch.ops.vllm_ir_core.rms_norm.default
print(vllm_ir.NAMESPACE)
"""


def _run(code: str, path: Path | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.fixture(scope="module")
def fake_vllm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fake_vllm")
    (root / "vllm" / "ir").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "ir" / "__init__.py").write_text(textwrap.dedent(_FAKE_VLLM_IR))
    return root


def test_default_namespace_without_vllm_ir() -> None:
    # this test environment has no vLLM: the documented default holds
    assert not namespace.vllm_ships_ir()
    assert ir.NAMESPACE == namespace.DEFAULT_NAMESPACE == "vllm_ir"
    assert getattr(torch.ops, ir.NAMESPACE).rms_norm.default is ir.ops.rms_norm.torch_op


@pytest.mark.parametrize("vllm_first", [True, False], ids=["vllm-first", "vllm_ir-first"])
@pytest.mark.slow
def test_both_import_orders_beside_vllm_ir(fake_vllm: Path, vllm_first: bool) -> None:
    imports = ["import vllm.ir", "import vllm_ir"]
    first, second = imports if vllm_first else imports[::-1]
    result = _run(_CHECK.format(first=first, second=second), fake_vllm)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == namespace.FALLBACK_NAMESPACE


def test_a_taken_namespace_is_left_alone_without_vllm(tmp_path: Path) -> None:
    # another library already defined ops in vllm_ir (no vllm package at all)
    code = _FAKE_VLLM_IR + "\nimport vllm_ir\nprint(vllm_ir.NAMESPACE)\n"
    result = _run(code, None)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == namespace.FALLBACK_NAMESPACE


def test_vllm_without_ir_keeps_the_default(tmp_path: Path) -> None:
    # a vLLM without vllm.ir (before 0.32, or one that drops it; 0.34 still
    # ships it): nothing to avoid
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    result = _run("import vllm, vllm_ir; print(vllm_ir.NAMESPACE)", tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == namespace.DEFAULT_NAMESPACE
