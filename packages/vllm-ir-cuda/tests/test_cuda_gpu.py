"""The real kernels on an NVIDIA GPU; every test here skips without one.

The first test to need the kernels builds them (minutes when the cache under
VLLM_IR_CACHE_DIR is cold; seconds afterwards).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import vllm_ir as ir
import vllm_ir_cuda
from cuda_stand_ins import requires_cuda
from vllm_ir.testing import ConformanceCase, TinyDecoder
from vllm_ir_cuda import _build, layernorm, ops

pytestmark = requires_cuda

RMS = ir.ops.rms_norm
FUSED = ir.ops.fused_add_rms_norm
PROVIDER = vllm_ir_cuda.PROVIDER
DEVICE = "cuda"


@pytest.fixture(scope="module", autouse=True)
def kernels() -> Path:
    return _build.load()


def _close(got: object, want: object, dtype: torch.dtype) -> None:
    tol = RMS.tolerance(dtype)
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)


def test_the_build_registered_the_cuda_kernels(kernels: Path) -> None:
    assert kernels.exists()
    assert _build.is_loaded()
    for name in ops.SCHEMAS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"vllm_ir_cuda::{name}", "CUDA")


def test_dispatch_selects_vllm_c_on_cuda() -> None:
    x = torch.randn(4, 64, device=DEVICE, dtype=torch.float16)
    w = torch.ones(64, device=DEVICE, dtype=torch.float16)
    assert RMS.impls[PROVIDER].supported
    assert RMS.selected_impl(x, w, 1e-6).provider == PROVIDER
    assert FUSED.selected_impl(x, x.clone(), w, 1e-6).provider == PROVIDER
    # native named next: other providers' CUDA defaults (e.g. triton) come after it
    with RMS.set_priority([PROVIDER, "native"]):
        assert RMS.selected_impl(x, w, 1e-6, 32).provider == "native"  # variance_size declined
        assert RMS.selected_impl(x.double(), None, 1e-6).provider == "native"


_NORM_OPS = ("rms_norm", "fused_add_rms_norm", "vllm_rms_norm", "vllm_fused_add_rms_norm")
_KIT = [
    (op, check, dtype)
    for op in _NORM_OPS
    for check in ("correctness", "supports_args", "mutation", "opcheck")
    for dtype in ops.DTYPES
] + [(op, "compiled", dtype) for op in _NORM_OPS for dtype in (torch.float32, torch.bfloat16)]


@pytest.mark.parametrize(
    ("op_name", "check", "dtype"),
    _KIT,
    ids=[f"{o}-{c}-{str(d).removeprefix('torch.')}" for o, c, d in _KIT],
)
def test_conformance_kit(op_name: str, check: str, dtype: torch.dtype) -> None:
    ConformanceCase(ir.get_op(op_name), PROVIDER, check, dtype, DEVICE).check()


# -- the kernels over their launch paths ------------------------------------

# (rows, hidden): register-cached rows of 1, 2 and 4 vectors per thread, rows
# read twice (fp16 hidden 65536: 8192 vectors > 4 x 1024), odd and tiny rows
# (scalar path), one row and many rows
SHAPES = [
    (1, 64),
    (7, 96),
    (300, 1000),
    (5, 4095),
    (33, 4096),
    (3, 8192),
    (2, 16384),
    (2, 32768),
    (2, 65536),
    (4097, 128),
]


def _inputs(
    rows: int, hidden: int, dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(rows, hidden, device=DEVICE, generator=gen).to(dtype)
    r = torch.randn(rows, hidden, device=DEVICE, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, device=DEVICE, generator=gen)).to(dtype)
    return x, r, w


@pytest.mark.parametrize("dtype", ops.DTYPES, ids=str)
@pytest.mark.parametrize(("rows", "hidden"), SHAPES, ids=lambda v: str(v))
def test_kernels_match_native(rows: int, hidden: int, dtype: torch.dtype) -> None:
    x, r, w = _inputs(rows, hidden, dtype)
    for weight in (w, None):
        _close(layernorm.rms_norm(x, weight, 1e-6), RMS.native(x, weight, 1e-6), dtype)
        want = FUSED.native(x, r, weight, 1e-6)
        got = layernorm.fused_add_rms_norm(x.clone(), r.clone(), weight, 1e-6)
        _close(got, want, dtype)
        assert torch.equal(got[1], x + r)  # the stored sum is rounded exactly like torch's
        want = ir.ops.vllm_fused_add_rms_norm.native(x, r, weight, 1e-6)
        got = layernorm.vllm_fused_add_rms_norm(x.clone(), r.clone(), weight, 1e-6)
        _close(got, want, dtype)  # every launch path: cached fp32 sums, or recomputed
        assert torch.equal(got[1], x + r)


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` whose data starts one element past a 16-byte boundary."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    out = buf[1:].view(t.shape)
    out.copy_(t)
    return out


def _row_strided(t: torch.Tensor) -> torch.Tensor:
    rows, hidden = t.shape
    out = torch.empty(rows, 2 * hidden, dtype=t.dtype, device=t.device)[:, :hidden]
    return out.copy_(t)


def _rows_do_not_collapse(t: torch.Tensor) -> torch.Tensor:
    rows, hidden = t.shape
    return t.clone().view(2, rows // 2, hidden).transpose(0, 1)


def _last_dim_strided(t: torch.Tensor) -> torch.Tensor:
    return t.t().contiguous().t()


# each makes a fresh tensor with the values of its argument, in one layout
LAYOUTS = {
    "misaligned": _misaligned,  # the scalar path
    "row-strided": _row_strided,
    "rows-do-not-collapse": _rows_do_not_collapse,  # the binding copies
    "last-dim-strided": _last_dim_strided,  # the impl copies
}


@pytest.mark.parametrize("dtype", ops.DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts(layout: str, dtype: torch.dtype) -> None:
    make = LAYOUTS[layout]
    x, r, w = _inputs(6, 256, dtype)
    xs = make(x)
    _close(layernorm.rms_norm(xs, w, 1e-6), RMS.native(xs, w, 1e-6), dtype)
    xs, rs = make(x), make(r)
    strides = (xs.stride(), rs.stride())
    want = FUSED.native(xs, rs, w, 1e-6)
    got = layernorm.fused_add_rms_norm(xs, rs, w, 1e-6)
    assert got[0] is xs
    assert got[1] is rs
    assert (xs.stride(), rs.stride()) == strides
    _close(got, want, dtype)


def test_out_may_alias_x() -> None:
    x, _, w = _inputs(8, 4096, torch.bfloat16)
    want = RMS.native(x, w, 1e-6)
    ops.rms_norm(x, x, w, 1e-6)
    _close(x, want, torch.bfloat16)


def test_empty_inputs() -> None:
    x = torch.empty(0, 4096, device=DEVICE, dtype=torch.float16)
    assert layernorm.rms_norm(x, None, 1e-6).shape == (0, 4096)
    assert layernorm.fused_add_rms_norm(x, x.clone(), None, 1e-6)[0].shape == (0, 4096)


# -- the in-place contract ---------------------------------------------------


def test_fused_writes_into_the_activations() -> None:
    x, r, w = _inputs(16, 4096, torch.float16)
    x0, r0 = x.clone(), r.clone()
    ptrs = (x.data_ptr(), r.data_ptr())
    out, res = layernorm.fused_add_rms_norm(x, r, w, 1e-6)
    assert out is x
    assert res is r
    assert (x.data_ptr(), r.data_ptr()) == ptrs
    _close((x, r), FUSED.native(x0, r0, w, 1e-6), torch.float16)


def test_default_overload_keeps_inputs_and_maybe_inplace_reuses_them() -> None:
    x, r, w = _inputs(16, 4096, torch.bfloat16)
    x0, r0 = x.clone(), r.clone()
    want = FUSED.native(x0, r0, w, 1e-6)
    out = FUSED(x, r, w, 1e-6)
    assert torch.equal(x, x0)
    assert torch.equal(r, r0)
    _close(out, want, torch.bfloat16)
    out = FUSED.maybe_inplace(x, r, w, 1e-6)
    assert (out[0].data_ptr(), out[1].data_ptr()) == (x.data_ptr(), r.data_ptr())
    _close(out, want, torch.bfloat16)


# -- the torch ops ------------------------------------------------------------


@pytest.mark.parametrize("dtype", ops.DTYPES, ids=str)
def test_opcheck_kernel_ops(dtype: torch.dtype) -> None:
    x, r, w = _inputs(8, 512, dtype)
    for weight in (w, None):
        torch.library.opcheck(ops.rms_norm, (torch.empty_like(x), x, weight, 1e-6))
        torch.library.opcheck(ops.fused_add_rms_norm, (x.clone(), r.clone(), weight, 1e-5))


def test_binding_checks_arguments() -> None:
    x, r, w = _inputs(4, 256, torch.float16)
    with pytest.raises(RuntimeError, match="weight has dtype Float but x has dtype Half"):
        ops.rms_norm(torch.empty_like(x), x, w.float(), 1e-6)
    with pytest.raises(RuntimeError, match="out is on cpu but x is on cuda"):
        ops.rms_norm(torch.empty(4, 256, dtype=torch.float16), x, w, 1e-6)
    with pytest.raises(RuntimeError, match="must be contiguous in its last dimension"):
        ops.rms_norm(torch.empty_like(x), x.t().contiguous().t(), w, 1e-6)
    with pytest.raises(RuntimeError, match=r"weight must have shape \[256\]"):
        ops.rms_norm(torch.empty_like(x), x, w[:128], 1e-6)
    with pytest.raises(RuntimeError, match="x_residual has shape"):
        ops.fused_add_rms_norm(x, r[:2], w, 1e-6)
    with pytest.raises(RuntimeError, match="x has dtype Double"):
        ops.fused_add_rms_norm(x.double(), r.double(), None, 1e-6)


# -- batch invariance -----------------------------------------------------------


@pytest.mark.parametrize("hidden", [4096, 4095], ids=["vector", "scalar"])
def test_a_row_does_not_depend_on_its_batch(hidden: int) -> None:
    x, r, w = _inputs(64, hidden, torch.bfloat16)
    full = layernorm.rms_norm(x, w, 1e-6)
    for i in (0, 17, 63):
        assert torch.equal(layernorm.rms_norm(x[i : i + 1], w, 1e-6), full[i : i + 1])
    fused_full = layernorm.fused_add_rms_norm(x.clone(), r.clone(), w, 1e-6)
    part = layernorm.fused_add_rms_norm(x[5:9].clone(), r[5:9].clone(), w, 1e-6)
    assert torch.equal(part[0], fused_full[0][5:9])


# -- compiled ---------------------------------------------------------------


@pytest.fixture
def no_inductor_cache() -> Iterator[None]:
    from vllm_ir.testing import inductor_caches_off

    with inductor_caches_off():
        yield


@pytest.mark.usefixtures("no_inductor_cache")
def test_eager_equals_compiled_with_zero_clones() -> None:
    layers = 3
    torch._dynamo.reset()
    model = TinyDecoder(256, layers).to(DEVICE, torch.bfloat16).eval()
    backend = ir.VllmIRBackend(priority={"rms_norm": [PROVIDER], "fused_add_rms_norm": [PROVIDER]})
    compiled = torch.compile(model, backend=backend, dynamic=False)
    x = torch.randn(8, 256, device=DEVICE, dtype=torch.bfloat16)
    with torch.no_grad():
        eager = model(x.clone())
        got = compiled(x.clone())
    assert RMS.selected_impl(x, model.weight, 1e-6).provider == PROVIDER
    _close(got, eager, torch.bfloat16)
    assert set(backend.lowering_pass.selected_impls["fused_add_rms_norm"].values()) == {PROVIDER}
    ctx = backend.pass_contexts[0]
    assert ctx.clones_inserted == 2 * layers
    assert ctx.clones_removed == 2 * layers, ctx.clones_kept


# -- building in a fresh process -----------------------------------------------


def _env() -> dict[str, str]:
    env = dict(os.environ)
    parent = str(Path(vllm_ir_cuda.__file__).parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [parent, env.get("PYTHONPATH")]))
    return env


def test_build_command_succeeds() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "vllm_ir_cuda", "build"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr
    assert "built and loaded from" in result.stdout


def test_first_kernel_call_in_a_fresh_process_loads_the_kernels() -> None:
    code = (
        "import torch\n"
        "from vllm_ir_cuda import _build, ops\n"
        "import vllm_ir as ir\n"
        "assert not _build.is_loaded()\n"
        "x = torch.randn(3, 4096, device='cuda', dtype=torch.float16)\n"
        "out = torch.empty_like(x)\n"
        "ops.rms_norm(out, x, None, 1e-6)\n"
        "assert _build.is_loaded()\n"
        "torch.testing.assert_close(out, ir.ops.rms_norm.native(x, None, 1e-6), "
        "atol=1e-3, rtol=1e-3)\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=1800
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# -- silu_and_mul and the FP8 ops ----------------------------------------------------

_NEW_OPS = [
    "silu_and_mul",
    "static_scaled_fp8_quant",
    "dynamic_per_token_fp8_quant",
    "rms_norm_static_fp8_quant",
    "fused_add_rms_norm_static_fp8_quant",
]


def _quant_args(name: str, rows: int, hidden: int, dtype: torch.dtype) -> tuple[object, ...]:
    x, r, w = _inputs(rows, hidden, dtype)
    scale = torch.tensor([0.02], device=DEVICE)
    return {
        "silu_and_mul": (x,),
        "static_scaled_fp8_quant": (x, scale),
        "dynamic_per_token_fp8_quant": (x,),
        "rms_norm_static_fp8_quant": (x, w, 1e-6, scale),
        "fused_add_rms_norm_static_fp8_quant": (x, r, w, 1e-6, scale),
    }[name]


def _compare(name: str, got: object, want: object, dtype: torch.dtype) -> None:
    """The promises of vllm_ir.provider's tolerances: bits for silu/static/dynamic, one FP8 step
    after a norm (and only where the norm's result differs)."""
    from vllm_ir.kits.quant import fp8_steps_apart

    gots = got if isinstance(got, tuple) else (got,)
    wants = want if isinstance(want, tuple) else (want,)
    for g, w in zip(gots, wants, strict=True):
        assert isinstance(g, torch.Tensor)
        assert isinstance(w, torch.Tensor)
        if g.dtype == torch.float8_e4m3fn:
            steps = fp8_steps_apart(g, w)
            limit = 1 if name.startswith(("rms_norm", "fused")) else 0
            assert int(steps.max()) <= limit, (name, int((steps > 0).sum()))
        elif name == "silu_and_mul":
            tol = ir.ops.silu_and_mul.tolerance(dtype)
            torch.testing.assert_close(g, w, atol=tol.atol, rtol=tol.rtol)
        else:
            assert torch.equal(g, w), name  # scales and the stored residual sum: exact


@pytest.mark.parametrize("dtype", ops.DTYPES, ids=str)
@pytest.mark.parametrize(("rows", "hidden"), [(1, 64), (7, 96), (33, 4096), (5, 4095), (2, 8192)])
@pytest.mark.parametrize("name", _NEW_OPS)
def test_new_ops_match_native(name: str, rows: int, hidden: int, dtype: torch.dtype) -> None:
    op = ir.get_op(name)
    args = _quant_args(name, rows, hidden, dtype)
    if name == "silu_and_mul" and hidden % 2:
        # an odd width is the op's error: the same ValueError from native and the impl
        odd = re.escape(f"silu_and_mul: x's last dimension ({hidden}) must be even")
        with pytest.raises(ValueError, match=odd):
            op.native(*args)
        with op.set_priority([PROVIDER]):
            assert op.selected_impl(*args).provider == PROVIDER  # sizes: not in supports_args
            with pytest.raises(ValueError, match=odd):
                op(*args)
        return
    with op.set_priority([PROVIDER]):
        assert op.selected_impl(*args).provider == PROVIDER
        got = op(*args)
    _compare(name, got, op.native(*args), dtype)


@pytest.mark.parametrize("name", _NEW_OPS)
def test_new_ops_conformance(name: str) -> None:
    for check in ("correctness", "supports_args", "mutation", "opcheck"):
        ConformanceCase(ir.get_op(name), PROVIDER, check, torch.bfloat16, DEVICE).check()


def test_new_ops_binding_checks_arguments() -> None:
    x, _, w = _inputs(4, 256, torch.bfloat16)
    q = torch.empty(4, 256, device=DEVICE, dtype=torch.float8_e4m3fn)
    s = torch.tensor([0.1], device=DEVICE)
    with pytest.raises(RuntimeError, match="must be contiguous in its last dimension"):
        ops.static_scaled_fp8_quant(q, x.t().contiguous().t(), s)
    with pytest.raises(RuntimeError, match="out has dtype"):
        ops.static_scaled_fp8_quant(torch.empty_like(x), x, s)
    with pytest.raises(RuntimeError, match="scale must be one float32 element"):
        ops.rms_norm_static_fp8_quant(q, x, w, 1e-6, s.double())
    with pytest.raises(RuntimeError, match="must be even"):
        ops.silu_and_mul(torch.empty(4, 128, device=DEVICE), x[:, :255].float())
    with pytest.raises(RuntimeError, match="scales has shape"):
        ops.dynamic_per_token_fp8_quant(q, torch.empty(4, device=DEVICE), x, None)


# -- CUDA graphs: every impl captured, replays equal eager -----------------------------


def _graph_args(name: str) -> tuple[object, ...]:
    if name in ("rms_norm", "fused_add_rms_norm"):
        x, r, w = _inputs(16, 4096, torch.bfloat16)
        return (x, w, 1e-6) if name == "rms_norm" else (x, r, w, 1e-6)
    return _quant_args(name, 16, 4096, torch.bfloat16)


def _flat(out: object) -> list[torch.Tensor]:
    return [t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("name", ["rms_norm", "fused_add_rms_norm", *_NEW_OPS])
def test_cuda_graph_replays_equal_eager(name: str) -> None:
    op = ir.get_op(name)
    args = _graph_args(name)
    with op.set_priority([PROVIDER]):
        want = [t.clone() for t in _flat(op(*args))]  # default overload: inputs untouched
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            op(*args)  # warm up (and build) outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = _flat(op(*args))
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        for got, exp in zip(captured, want, strict=True):
            assert torch.equal(got.view(torch.uint8), exp.view(torch.uint8)), name


@pytest.mark.usefixtures("no_inductor_cache")
def test_reduce_overhead_compile_runs_the_kernels() -> None:
    torch._dynamo.reset()
    model = TinyDecoder(256, 2).to(DEVICE, torch.bfloat16).eval()
    priority = {"rms_norm": [PROVIDER], "fused_add_rms_norm": [PROVIDER]}
    with ir.IrOpPriorityConfig(**priority).scope():
        compiled = torch.compile(model, backend="vllm_ir", mode="reduce-overhead", dynamic=False)
        x = torch.randn(8, 256, device=DEVICE, dtype=torch.bfloat16)
        with torch.no_grad():
            eager = model(x.clone())
            for _ in range(3):  # record, then replay the graph
                got = compiled(x.clone())
    _close(got, eager, torch.bfloat16)


# -- gelu_and_mul and rotary_embedding ---------------------------------------------------


def _rope_tables(tokens: int, rot: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.rand(tokens, rot // 2, device=DEVICE) * 100
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((cos, cos), -1).to(dtype), torch.cat((sin, sin), -1).to(dtype)


@pytest.mark.parametrize("dtype", ops.DTYPES, ids=str)
@pytest.mark.parametrize(("rows", "hidden"), [(1, 128), (7, 96), (33, 16384), (5, 34)])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_and_mul_matches_native(
    approximate: str, rows: int, hidden: int, dtype: torch.dtype
) -> None:
    op = ir.ops.gelu_and_mul
    x = (torch.randn(rows, hidden, device=DEVICE) * 3).to(dtype)
    with op.set_priority([PROVIDER]):
        assert op.selected_impl(x, approximate).provider == PROVIDER
        got = op(x, approximate)
    tol = op.tolerance(dtype)
    torch.testing.assert_close(got, op.native(x, approximate), atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("dtype", ops.DTYPES, ids=str)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize(
    ("tokens", "heads", "kv_heads", "head_size", "rot"),
    [(1, 32, 8, 128, 128), (17, 8, 1, 256, 256), (5, 4, 2, 64, 32), (3, 2, 1, 22, 18)],
)
def test_rotary_embedding_matches_native_bit_for_bit(
    tokens: int, heads: int, kv_heads: int, head_size: int, rot: int, is_neox: bool, dtype
) -> None:  # type: ignore[no-untyped-def]
    op = ir.ops.rotary_embedding
    q = torch.randn(tokens, heads, head_size, device=DEVICE).to(dtype)
    k = torch.randn(tokens, kv_heads, head_size, device=DEVICE).to(dtype)
    cos, sin = _rope_tables(tokens, rot, dtype)
    want = op.native(q, k, cos, sin, is_neox)
    with op.set_priority([PROVIDER]):
        assert op.selected_impl(q, k, cos, sin, is_neox).provider == PROVIDER
        got = op.maybe_inplace(q, k, cos, sin, is_neox)
    assert got[0] is q
    assert got[1] is k
    torch.testing.assert_close(got, want, atol=0, rtol=0)  # __fmul_rn/__fadd_rn: native's bits


def test_rotary_embedding_hugging_face_layout() -> None:
    # [batch, heads, seq, head] as its transpose(1, 2): token dims that do not collapse
    op = ir.ops.rotary_embedding
    q = torch.randn(2, 8, 9, 64, device=DEVICE, dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(2, 2, 9, 64, device=DEVICE, dtype=torch.bfloat16).transpose(1, 2)
    cos, sin = _rope_tables(9, 64, torch.bfloat16)
    want = op.native(q, k, cos[None], sin[None])
    with op.set_priority([PROVIDER]):
        got = op.maybe_inplace(q, k, cos[None], sin[None])
    assert got[0] is q
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("name", ["gelu_and_mul", "rotary_embedding"])
def test_gelu_rotary_conformance(name: str) -> None:
    for check in ("correctness", "supports_args", "mutation", "opcheck"):
        for dtype in ops.DTYPES:
            ConformanceCase(ir.get_op(name), PROVIDER, check, dtype, DEVICE).check()


def test_gelu_rotary_binding_checks_arguments() -> None:
    x = torch.randn(4, 256, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match='approximate must be "none" or "tanh"'):
        ops.gelu_and_mul(torch.empty(4, 128, device=DEVICE, dtype=x.dtype), x, "erf")
    with pytest.raises(RuntimeError, match="must be even"):
        ops.gelu_and_mul(torch.empty(4, 127, device=DEVICE, dtype=x.dtype), x[:, :255], "none")
    q = torch.randn(3, 4, 64, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(3, 1, 64, device=DEVICE, dtype=torch.bfloat16)
    cos, sin = _rope_tables(3, 64, torch.bfloat16)
    with pytest.raises(RuntimeError, match="must be contiguous in its last dimension"):
        ops.rotary_embedding(q.transpose(1, 2).contiguous().transpose(1, 2), k, cos, sin, True)
    with pytest.raises(RuntimeError, match="must be even and at most the head size"):
        ops.rotary_embedding(q, k, cos[:, :63], sin[:, :63], True)
    with pytest.raises(RuntimeError, match="contiguous rows and one row stride"):
        ops.rotary_embedding(q, k, cos, sin.contiguous().t().contiguous().t(), True)
    with pytest.raises(RuntimeError, match="same token dimensions"):
        ops.rotary_embedding(q, k[:2], cos, sin, True)
