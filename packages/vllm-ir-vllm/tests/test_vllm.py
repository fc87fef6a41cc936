"""The plugin inside the real vLLM, without an engine (``nox -s vllm``).

Needs ``vllm`` (0.33.0 or 0.34.0, one per instance of the session: installed
without its dependencies plus the packages its config, plugin and layer code
import, see the noxfile); skipped where it is absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import entry_points, files, version
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (nox -s vllm installs it)")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # a CPU-only torch: vLLM's CPU platform

import vllm_ir as ir
import vllm_ir_vllm
from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
from vllm.model_executor import hw_agnostic
from vllm.model_executor.hw_agnostic.custom_op import CustomOp, op_registry_oot
from vllm.model_executor.hw_agnostic.layers.activation import SiluAndMul
from vllm.model_executor.hw_agnostic.layers.layernorm import RMSNorm
from vllm_ir.provider import recording_registrations
from vllm_ir.testing import FALLBACK_NAMESPACE
from vllm_ir_vllm import layers

VLLM = version("vllm")
MARKER = "vllm_marker"
OPS = ("vllm_rms_norm", "vllm_fused_add_rms_norm", "silu_and_mul")
IrRMSNorm = layers.replacement(RMSNorm, layers.RMSNormRoute)
IrSiluAndMul = layers.replacement(SiluAndMul, layers.SiluAndMulRoute)

# -- coexistence --------------------------------------------------------------

_COEXIST = """
import torch
{first}
{second}
from vllm import ir as vllm_ir_of_vllm
import vllm_ir
x, w = torch.randn(4, 64), torch.rand(64) + 0.5
ours = vllm_ir.ops.rms_norm(x, w, 1e-6)
theirs = vllm_ir_of_vllm.ops.rms_norm(x, w, 1e-6)
torch.testing.assert_close(ours, theirs)
torch.testing.assert_close(getattr(torch.ops, vllm_ir.NAMESPACE).rms_norm(x, w, 1e-6), ours)
print(vllm_ir.NAMESPACE)
"""


@pytest.mark.parametrize("vllm_first", [True, False], ids=["vllm-first", "vllm_ir-first"])
def test_both_import_orders(vllm_first: bool) -> None:
    imports = ["import vllm.config", "import vllm_ir"]
    first, second = imports if vllm_first else imports[::-1]
    result = subprocess.run(
        [sys.executable, "-c", _COEXIST.format(first=first, second=second)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "vllm_ir_core"


def test_the_namespace_is_chosen_without_importing_vllm() -> None:
    """0.33 and 0.34 both ship ``vllm.ir``, which claims ``vllm_ir`` when imported:
    vllm-ir takes ``vllm_ir_core`` from the installed files alone."""
    shipped = files("vllm") or []
    assert any(f.parts[:2] == ("vllm", "ir") for f in shipped), f"vLLM {VLLM} ships vllm/ir"
    code = (
        "import sys, vllm_ir\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'vllm'], 'vllm imported'\n"
        "print(vllm_ir.NAMESPACE)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == FALLBACK_NAMESPACE


# -- plugin discovery ---------------------------------------------------------


@pytest.fixture
def teardown() -> Iterator[None]:
    """Every test leaves no OOT class, priority or marker impl behind."""
    yield
    vllm_ir_vllm.unregister()
    assert not set(layers.replacements().values()) & set(op_registry_oot.values())


def test_general_plugins_load_the_plugin(monkeypatch: pytest.MonkeyPatch, teardown: None) -> None:
    import vllm.plugins

    assert "vllm_ir" in {ep.name for ep in entry_points(group="vllm.general_plugins")}
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    vllm.plugins.load_general_plugins()
    assert op_registry_oot["RMSNorm"] is IrRMSNorm
    assert op_registry_oot["SiluAndMul"] is IrSiluAndMul
    # vLLM's in-tree layers (its default model implementation builds them) too
    from vllm.model_executor.custom_op import op_registry_oot as in_tree_registry
    from vllm.model_executor.layers.layernorm import RMSNorm as InTreeRMSNorm

    assert in_tree_registry["RMSNorm"] is layers.replacement(InTreeRMSNorm, layers.RMSNormRoute)
    vllm_ir_vllm.register()  # vLLM may load a plugin twice: no duplicate error


# -- layers under a VllmConfig --------------------------------------------------


class Marker:
    """A marker impl of each op: native results, every call counted."""

    def __init__(self) -> None:
        self.calls = dict.fromkeys(OPS, 0)
        self._log: Any = None

    def __enter__(self) -> Marker:
        with recording_registrations() as log:
            for name in OPS:
                op = ir.get_op(name)
                op.register_impl(MARKER)(self._counting(name, op.native))
        self._log = log
        return self

    def _counting(self, name: str, native: Any) -> Any:
        def impl(*args: Any) -> Any:
            self.calls[name] += 1
            return native(*args)

        impl.__signature__ = ir.get_op(name).signature  # type: ignore[attr-defined]
        return impl

    def __exit__(self, *exc: object) -> None:
        self._log.remove()


@pytest.fixture
def marker(monkeypatch: pytest.MonkeyPatch, teardown: None) -> Iterator[Marker]:
    with Marker() as m:
        for name in OPS:
            monkeypatch.setenv(f"VLLM_IR_PRIORITY_{name.upper()}", f"{MARKER},native")
        vllm_ir_vllm.register()  # reads the VLLM_IR_* settings
        yield m


@contextlib.contextmanager
def _triton_cpu_stand_in() -> Iterator[None]:
    """vLLM 0.34's CPU platform refuses to configure an x86 machine without
    triton-cpu (``vllm/platforms/cpu.py``, ``check_and_update_config``; 0.33 only
    warns). vLLM's CPU builds ship it, no package index has it, and these tests
    run no Triton kernel: while a config is built, vLLM sees Triton as present."""
    import vllm.triton_utils
    from vllm.platforms import CpuArchEnum, current_platform

    missing = (
        current_platform.is_cpu()
        and current_platform.get_cpu_architecture() == CpuArchEnum.X86
        and not vllm.triton_utils.HAS_TRITON
    )
    if not missing:
        yield
        return
    with mock.patch.object(vllm.triton_utils, "HAS_TRITON", True):
        yield


def _config(custom_ops: list[str]) -> VllmConfig:
    with _triton_cpu_stand_in():
        return VllmConfig(compilation_config=CompilationConfig(custom_ops=custom_ops))


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, op: str) -> None:
    tol = ir.get_op(op).tolerances.get(expected.dtype) or ir.Tolerance(atol=1e-5, rtol=1e-5)
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_runs_the_prioritized_impl(marker: Marker, dtype: torch.dtype) -> None:
    with set_current_vllm_config(_config(["all"])), torch.inference_mode():
        norm = RMSNorm(96, eps=1e-5, dtype=dtype)
        assert isinstance(norm, IrRMSNorm)
        with torch.no_grad():
            norm.weight.copy_(1 + 0.1 * torch.randn(96))
        x = torch.randn(5, 96, dtype=dtype)
        assert norm.ir_provider(x) == MARKER
        _assert_close(norm(x), norm.forward_native(x), "rms_norm")
    assert marker.calls["vllm_rms_norm"] == 1


def test_fused_add_in_fp32_runs_the_prioritized_impl(marker: Marker) -> None:
    with set_current_vllm_config(_config(["+rms_norm"])), torch.inference_mode():
        norm = RMSNorm(64, dtype=torch.float32, var_hidden_size=48)
        x, residual = torch.randn(3, 64), torch.randn(3, 64)
        expected = norm.forward_native(x, residual)
        assert norm.ir_provider(x, residual) == MARKER
        out, new_residual = norm(x.clone(), residual.clone())  # donated: maybe_inplace
    assert marker.calls["vllm_fused_add_rms_norm"] == 1
    _assert_close(out, expected[0], "fused_add_rms_norm")
    _assert_close(new_residual, expected[1], "fused_add_rms_norm")


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32])
def test_fused_add_in_bf16_runs_the_impl_with_vllms_numerics(
    marker: Marker, weight_dtype: torch.dtype
) -> None:
    """bf16, and a weight of another dtype: vLLM normalizes the fp32 sum and multiplies in
    the weight's dtype, and so does ``vllm_fused_add_rms_norm``: bit for bit."""
    with set_current_vllm_config(_config(["all"])), torch.inference_mode():
        norm = RMSNorm(64, dtype=weight_dtype)
        with torch.no_grad():
            norm.weight.copy_(1 + 0.1 * torch.randn(64))
        x = torch.randn(3, 64, dtype=torch.bfloat16)
        residual = torch.randn(3, 64, dtype=torch.bfloat16)
        expected = norm.forward_native(x.clone(), residual.clone())
        assert norm.ir_provider(x, residual) == MARKER
        out, new_residual = norm(x, residual)
        plain = norm(x)
    assert marker.calls["vllm_fused_add_rms_norm"] == marker.calls["vllm_rms_norm"] == 1
    assert torch.equal(out, expected[0])
    assert torch.equal(new_residual, expected[1])
    assert torch.equal(plain, norm.forward_native(x))


def test_silu_and_mul_runs_the_prioritized_impl(marker: Marker) -> None:
    with set_current_vllm_config(_config(["all"])), torch.inference_mode():
        act = SiluAndMul()
        assert isinstance(act, IrSiluAndMul)
        x = torch.randn(4, 2, 64, dtype=torch.bfloat16)
        assert act.ir_provider(x) == MARKER
        _assert_close(act(x), act.forward_native(x), "silu_and_mul")
    assert marker.calls["silu_and_mul"] == 1


def test_a_disabled_custom_op_runs_vllm_native(marker: Marker) -> None:
    with set_current_vllm_config(_config(["all", "-rms_norm"])), torch.inference_mode():
        norm, act = RMSNorm(32), SiluAndMul()
        x = torch.randn(2, 32)
        assert norm.ir_provider(x) == "vllm native (custom op rms_norm disabled)"
        norm(x)
        act(x)
    assert marker.calls["vllm_rms_norm"] == 0
    assert marker.calls["silu_and_mul"] == 1


def test_unregister_restores_vllm(marker: Marker) -> None:
    vllm_ir_vllm.unregister()
    with set_current_vllm_config(_config(["all"])):
        assert type(RMSNorm(8)) is RMSNorm
        assert type(SiluAndMul()) is SiluAndMul
    assert ir.ops.vllm_rms_norm.get_priority()[0] != MARKER


def test_registering_twice_then_unregistering_leaves_no_setting(marker: Marker) -> None:
    """vLLM may load the plugin twice; each apply() handle takes back only its own
    setting, so the plugin keeps one handle and unregister() leaves none behind."""
    vllm_ir_vllm.register()
    assert ir.ops.vllm_rms_norm.get_priority()[0] == MARKER
    vllm_ir_vllm.unregister()
    for name in OPS:
        assert ir.get_op(name).get_priority_entries()[0].source != "user (process-wide)"


def test_a_per_rank_file_is_read_when_the_worker_builds_a_layer(
    marker: Marker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's workers set no RANK and get their rank (torch.distributed) after the
    plugin loads: a ``{rank}`` file is read when the first replaced layer is built,
    as that rank's file, never as rank 0's."""
    for name in ("RANK", "LOCAL_RANK", "VLLM_IR_PRIORITY_VLLM_RMS_NORM"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "p-1.json").write_text(json.dumps({"vllm_rms_norm": [MARKER, "native"]}))
    (tmp_path / "p-0.json").write_text(json.dumps({"vllm_rms_norm": ["native"]}))
    monkeypatch.setenv("VLLM_IR_PRIORITY_FILE", str(tmp_path / "p-{rank}.json"))
    vllm_ir_vllm.register()
    assert ir.ops.vllm_rms_norm.get_priority_entries()[0].source != "user (process-wide)"
    assert ir.ops.silu_and_mul.get_priority()[0] == MARKER  # its variable: applied at once
    monkeypatch.setenv("RANK", "1")  # what the worker's distributed setup makes known
    with set_current_vllm_config(_config(["all"])), torch.inference_mode():
        RMSNorm(8)
    assert ir.ops.vllm_rms_norm.get_priority() == [MARKER, "native"]
    assert ir.ops.silu_and_mul.get_priority()[0] == MARKER  # the variable still wins


def test_vllm_does_not_call_the_plugins_variables_unknown(marker: Marker) -> None:
    """vLLM checks ``VLLM_*`` variables against its own table after loading plugins:
    the plugin's are in it, so a strict engine (``fail_on_environ_validation``) starts."""
    from vllm.platforms import current_platform

    assert os.environ["VLLM_IR_PRIORITY_VLLM_RMS_NORM"]  # set by the marker fixture
    current_platform.validate_environ(hard_fail=True)


def test_register_and_unregister_forget_vllms_shared_ropes(teardown: None) -> None:
    """vLLM's ``get_rope`` hands later models the RoPE module it cached: after
    ``register`` or ``unregister`` that cache is emptied, so a model built next
    gets a RoPE module of the class then registered."""
    from vllm.model_executor.layers import rotary_embedding

    vllm_ir_vllm.unregister()
    cached = rotary_embedding._ROPE_DICT
    cached[("built", "before")] = object()
    vllm_ir_vllm.register()
    assert not cached
    cached[("built", "while registered")] = object()
    vllm_ir_vllm.unregister()
    assert not cached


def test_compiled_layers_keep_the_selection(marker: Marker) -> None:
    """Dynamo traces ``forward_oot`` whole (no graph break); the IR op is one node that
    runs the prioritized impl (aot_eager: no Inductor codegen)."""
    with set_current_vllm_config(_config(["all"])), torch.inference_mode():
        norm = RMSNorm(64, dtype=torch.float32)
        compiled = torch.compile(norm, backend="aot_eager", fullgraph=True)
        x = torch.randn(4, 64)
        _assert_close(compiled(x), norm.forward_native(x), "rms_norm")
        assert marker.calls["vllm_rms_norm"] == 1
        x16 = x.bfloat16()
        out, _ = compiled(x16, x16.clone())  # bf16 sum: vLLM's numerics, through the op
        assert torch.equal(out, norm.forward_native(x16, x16.clone())[0])
    assert marker.calls["vllm_fused_add_rms_norm"] == 1


def test_in_tree_layers_run_through_vllm_ir(marker: Marker) -> None:
    """vLLM's in-tree layers (what its own model implementations build) are the plugin's:
    RMSNorm and SiluAndMul on their ops, RotaryEmbedding (fp32) on rotary_embedding with
    vLLM's native numbers, and a bf16 RoPE call runs what vLLM runs, saying why."""
    from vllm.model_executor.layers.activation import SiluAndMul as InTreeSiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm as InTreeRMSNorm
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

    with set_current_vllm_config(_config(["all"])), torch.inference_mode():
        norm, act = InTreeRMSNorm(64), InTreeSiluAndMul()
        rope = RotaryEmbedding(32, 32, 128, 10000.0, True, torch.float32)
        assert isinstance(norm, layers.RMSNormRoute)
        assert isinstance(act, layers.SiluAndMulRoute)
        assert isinstance(rope, layers.RotaryEmbeddingRoute)
        x = torch.randn(3, 64)
        _assert_close(norm(x), norm.forward_native(x), "rms_norm")
        _assert_close(act(x), act.forward_native(x), "silu_and_mul")
        positions = torch.tensor([0, 5, 77])
        q, k = torch.randn(3, 4 * 32), torch.randn(3, 2 * 32)
        got = rope(positions, q.clone(), k.clone())
        want = rope.forward_native(positions, q.clone(), k.clone())
        for a, b in zip(got, want, strict=True):
            _assert_close(a, b, "rotary_embedding")
        assert not rope.ir_provider(positions, q, k).startswith("vllm")
        # bf16 on CPU: rotary_embedding_fp32, what vLLM's CPU kernel computes
        rope16 = RotaryEmbedding(32, 32, 128, 10000.0, True, torch.bfloat16)
        q16, k16 = q.bfloat16(), k.bfloat16()
        assert not rope16.ir_provider(positions, q16, k16).startswith("vllm")
        got16 = rope16(positions, q16.clone(), k16.clone())
        cos, sin = rope16.cos_sin_cache[positions].chunk(2, dim=-1)
        for out, x in zip(got16, (q16, k16), strict=True):
            xs = x.view(3, -1, 32).float()
            c, s = cos.float().unsqueeze(1), sin.float().unsqueeze(1)
            x1, x2 = xs[..., :16], xs[..., 16:]
            want = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).bfloat16()
            assert torch.equal(out.view(3, -1, 32), want)  # fp32, rounded once
        # the cos/sin table is built once, also where the query's dtype is not the
        # cache's: vLLM keeps the cache it converts (the table is rebuilt per cache)
        rope(positions, q16.clone(), k16.clone())
        table = rope._ir_table
        rope(positions, q16.clone(), k16.clone())
        assert rope._ir_table is table
    assert marker.calls["vllm_rms_norm"] == marker.calls["silu_and_mul"] == 1


# -- vLLM 0.34: hw_agnostic.resolve() and its subclass check ---------------------


def test_resolve_builds_the_plugin_layers(monkeypatch: pytest.MonkeyPatch, marker: Marker) -> None:
    """vLLM 0.34 builds the Transformers backend's layers through
    ``hw_agnostic.resolve(module, name)``: the hardware-agnostic class under
    ``VLLM_USE_HW_AGNOSTIC=1``, else the in-tree one. An override registered for
    the hardware-agnostic path must subclass what it replaces, or building the
    layer raises ``TypeError``. The plugin's layers subclass the resolved classes,
    and building a resolved class builds the plugin's layer."""
    resolve = getattr(hw_agnostic, "resolve", None)
    if resolve is None:
        pytest.skip(f"vLLM {VLLM} has no hw_agnostic.resolve() (0.34 adds it)")
    monkeypatch.setenv("VLLM_USE_HW_AGNOSTIC", "1")
    norm_cls = resolve("layernorm", "RMSNorm")
    act_cls = resolve("activation", "SiluAndMul")
    assert (norm_cls, act_cls) == (RMSNorm, SiluAndMul)
    assert issubclass(IrRMSNorm, norm_cls)
    assert issubclass(IrSiluAndMul, act_cls)
    with set_current_vllm_config(_config(["all"])), torch.inference_mode():
        norm, act = norm_cls(64, dtype=torch.float32), act_cls()
        assert type(norm) is IrRMSNorm
        assert type(act) is IrSiluAndMul
        x = torch.randn(3, 64)
        _assert_close(norm(x), norm.forward_native(x), "rms_norm")
        _assert_close(act(x), act.forward_native(x), "silu_and_mul")
    assert marker.calls["vllm_rms_norm"] == marker.calls["silu_and_mul"] == 1

    # the check is live in this vLLM: an override that does not derive from
    # the hardware-agnostic layer is refused where the layer is built
    class NotASiluAndMul(CustomOp):
        def forward_native(self, x: torch.Tensor) -> torch.Tensor:
            return x

    op_registry_oot["SiluAndMul"] = NotASiluAndMul
    try:
        with set_current_vllm_config(_config(["all"])), pytest.raises(TypeError, match="derive"):
            act_cls()
    finally:
        op_registry_oot["SiluAndMul"] = IrSiluAndMul  # for unregister()

    # without VLLM_USE_HW_AGNOSTIC vLLM builds its in-tree layers, which the
    # plugin replaces by their own subclasses
    monkeypatch.delenv("VLLM_USE_HW_AGNOSTIC")
    in_tree = resolve("layernorm", "RMSNorm")
    assert in_tree.__module__ == "vllm.model_executor.layers.layernorm"
    assert not issubclass(IrRMSNorm, in_tree)
    with set_current_vllm_config(_config(["all"])):
        assert type(in_tree(8)) is layers.replacement(in_tree, layers.RMSNormRoute)
