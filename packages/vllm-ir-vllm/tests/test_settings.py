"""Priority settings and vLLM's numerics as ops (no vLLM needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import vllm_ir_vllm
from vllm_ir_vllm.settings import check_file, priority_config


def test_nothing_set_is_none() -> None:
    assert priority_config({}) is None


def test_per_op_variables_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tuned.json"
    # the shape `vllm-ir tune --out` writes: lists under "ir_op_priority"
    doc = {"ir_op_priority": {"rms_norm": ["native"], "silu_and_mul": ["native"]}, "times": {}}
    path.write_text(json.dumps(doc))
    env = {"VLLM_IR_PRIORITY_FILE": str(path), "VLLM_IR_PRIORITY_SILU_AND_MUL": " native "}
    config = priority_config(env)
    assert config is not None
    assert config.to_dict() == {"rms_norm": ["native"], "silu_and_mul": ["native"]}


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"VLLM_IR_PRIORITY_NO_SUCH_OP": "native"}, "VLLM_IR_PRIORITY_NO_SUCH_OP"),
        ({"VLLM_IR_PRIORITY_VLLM_RMS_NORM": "native,,"}, "VLLM_IR_PRIORITY_VLLM_RMS_NORM"),
        (
            {"VLLM_IR_PRIORITY_VLLM_RMS_NORM": "no_such_provider"},
            "VLLM_IR_PRIORITY_VLLM_RMS_NORM: unknown provider",
        ),
        ({"VLLM_IR_PRIORITY_FILE": "/no/such/file.json"}, "VLLM_IR_PRIORITY_FILE"),
        # the seed ops: vLLM's layers call the ops with vLLM's numerics instead
        (
            {"VLLM_IR_PRIORITY_RMS_NORM": "native"},
            "^VLLM_IR_PRIORITY_RMS_NORM: vLLM's layers never call rms_norm.*"
            "set VLLM_IR_PRIORITY_VLLM_RMS_NORM$",
        ),
        (
            {"VLLM_IR_PRIORITY_FUSED_ADD_RMS_NORM": "native"},
            "set VLLM_IR_PRIORITY_VLLM_FUSED_ADD_RMS_NORM$",
        ),
        ({"VLLM_IR_PRIORITY_GELU_AND_MUL": "native"}, "never call gelu_and_mul.*silu_and_mul"),
        # a typo is not a silent no-op
        (
            {"VLLM_IR_PRIORTY_VLLM_RMS_NORM": "native"},
            "^VLLM_IR_PRIORTY_VLLM_RMS_NORM is not a variable vllm-ir reads; "
            "did you mean VLLM_IR_PRIORITY_VLLM_RMS_NORM\\?$",
        ),
        ({"VLLM_IR_PLATFROM": "cpu"}, "did you mean VLLM_IR_PLATFORM"),
        ({"VLLM_IR_PRIORITY_FIEL": "x.json"}, "VLLM_IR_PRIORITY_FIEL"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(ValueError, match=names) as info:
        priority_config(env)
    assert "\n" not in str(info.value)


def test_what_the_project_and_its_tools_read_is_known() -> None:
    names = {"VLLM_IR_VLLM_MODEL": "m", "VLLM_IR_FUZZ_THREADS": "3", "VLLM_IR_CACHE_DIR": "/x"}
    names |= {"VLLM_IR_TEST_WORKERS": "2", "VLLM_IR_PRIORITY_SILU_AND_MUL": "native"}
    config = priority_config(names)
    assert config is not None
    assert config.to_dict() == {"silu_and_mul": ["native"]}


def test_a_per_rank_file_needs_a_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a rank a ``{rank}`` file is an error, never rank 0's; with one it is that
    rank's; ``read_file=False`` (the plugin at startup) leaves it to the worker."""
    (tmp_path / "p-1.json").write_text(json.dumps({"silu_and_mul": ["native"]}))
    env = {"VLLM_IR_PRIORITY_FILE": str(tmp_path / "p-{rank}.json")}
    for name in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert priority_config(env, read_file=False) is None
    check_file(env)  # each worker's own file: not checked at startup
    with pytest.raises(ValueError, match=r"VLLM_IR_PRIORITY_FILE=.*none is known"):
        priority_config(env)
    monkeypatch.setenv("RANK", "1")
    config = priority_config(env)
    assert config is not None
    assert config.to_dict() == {"silu_and_mul": ["native"]}
    with pytest.raises(ValueError, match=r"^VLLM_IR_PRIORITY_FILE='/no/such\.json': no such file$"):
        check_file({"VLLM_IR_PRIORITY_FILE": "/no/such.json"})


def test_the_plugin_entry_stops_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """What vLLM's load_general_plugins() calls: a bad setting is one line, not a traceback."""
    monkeypatch.setenv("VLLM_IR_PRIORITY_VLLM_RMS_NORM", "no_such_provider")
    with pytest.raises(SystemExit) as info:
        vllm_ir_vllm.register()
    assert str(info.value.code).startswith("vllm-ir-vllm: VLLM_IR_PRIORITY_VLLM_RMS_NORM")
    env = {**os.environ, "VLLM_IR_PRIORITY_VLLM_RMS_NORM": "no_such_provider"}
    result = subprocess.run(
        [sys.executable, "-c", "import vllm_ir_vllm; vllm_ir_vllm.register()"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [str(info.value.code)]


F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


@pytest.mark.parametrize(
    ("x", "residual", "weight"),
    [
        (BF16, None, BF16),
        (BF16, None, None),
        (BF16, None, F32),  # vLLM multiplies in the weight's dtype
        (F32, F32, F32),
        (F32, F32, None),
        (BF16, BF16, BF16),  # vLLM normalizes the fp32 sum
        (F16, F16, F16),
        (BF16, BF16, F32),
        (F32, BF16, F32),
    ],
)
def test_the_vllm_ops_compute_vllms_layer(
    x: torch.dtype, residual: torch.dtype | None, weight: torch.dtype | None
) -> None:
    """The ops the layers call (``vllm_rms_norm``, ``vllm_fused_add_rms_norm``) equal
    vLLM's expressions bit for bit, where the seed ops would differ."""
    import vllm_ir as ir

    gen = torch.Generator().manual_seed(0)
    xs = (torch.randn(8, 96, generator=gen) * 3).to(x)
    w = None if weight is None else (1 + 0.1 * torch.randn(96, generator=gen)).to(weight)
    if residual is None:
        ours = ir.ops.vllm_rms_norm.native(xs, w, 1e-6)
        theirs = _vllm_rms_norm(xs, w, 1e-6)
    else:
        rs = torch.randn(8, 96, generator=gen).to(residual)
        ours = ir.ops.vllm_fused_add_rms_norm.native(xs, rs, w, 1e-6)
        theirs = _vllm_fused_add_rms_norm(xs, rs, w, 1e-6)
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in _pairs(ours, theirs))


def _pairs(a: object, b: object) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        return [(a, b)]
    assert isinstance(a, tuple)
    assert isinstance(b, tuple)
    return list(zip(a, b, strict=True))


# vLLM 0.33/0.34's hw-agnostic RMSNorm._rms_norm / _fused_add_rms_norm, restated
# here so the ops are tested where vLLM is not installed (test_vllm.py
# compares against the real layer)
def _vllm_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    orig = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    if weight is not None:
        x = x.to(weight.dtype) * weight
    return x.to(orig)


def _vllm_fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    orig = x.dtype
    s = x.to(torch.float32) + residual.to(torch.float32)
    new_residual = s.to(orig)
    s = s * torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + eps)
    if weight is not None:
        s = s.to(weight.dtype) * weight
    return s.to(orig), new_residual
