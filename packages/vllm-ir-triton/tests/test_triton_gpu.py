"""The compiled kernels on a GPU: CUDA-graph capture and replay of every impl, the direct
relaunch of compiled kernels, a scale on another device, and user Triton kernels traced
into the compiled graph. Every test here skips without CUDA (the interpreter cannot
capture graphs or launch compiled kernels).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import triton
import triton.language as tl
import vllm_ir as ir
from torch import Tensor
from vllm_ir.kits.quant import fp8_steps_apart

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DEVICE = "cuda"
_NORMS = ["rms_norm", "fused_add_rms_norm"]
_QUANT = [
    "silu_and_mul",
    "static_scaled_fp8_quant",
    "dynamic_per_token_fp8_quant",
    "rms_norm_static_fp8_quant",
    "fused_add_rms_norm_static_fp8_quant",
]
_GRAPH_CASES = [
    *[(name, p) for name in _NORMS for p in ("triton", "triton_batch_invariant")],
    *[(name, "triton") for name in _QUANT],
]


def _args(name: str, rows: int, hidden: int, dtype: torch.dtype) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(rows * 7919 + hidden)
    x = torch.randn(rows, hidden, generator=g).to(DEVICE, dtype)
    r = torch.randn(rows, hidden, generator=g).to(DEVICE, dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(DEVICE, dtype)
    scale = torch.tensor([0.02], device=DEVICE)
    return {
        "rms_norm": (x, w, 1e-6),
        "fused_add_rms_norm": (x, r, w, 1e-6),
        "silu_and_mul": (x,),
        "static_scaled_fp8_quant": (x, scale),
        "dynamic_per_token_fp8_quant": (x,),
        "rms_norm_static_fp8_quant": (x, w, 1e-6, scale),
        "fused_add_rms_norm_static_fp8_quant": (x, r, w, 1e-6, scale),
    }[name]


def _flat(out: object) -> list[Tensor]:
    return [t for t in (out if isinstance(out, tuple) else (out,)) if isinstance(t, Tensor)]


def _bits(t: Tensor) -> Tensor:
    return t.view(torch.uint8)


@pytest.mark.parametrize(
    ("name", "provider"), _GRAPH_CASES, ids=[f"{n}-{p}" for n, p in _GRAPH_CASES]
)
def test_cuda_graph_replays_equal_eager(name: str, provider: str) -> None:
    """Captured in a CUDAGraph (the warm-up call compiles, so the captured call takes the
    direct relaunch), every replay writes exactly what the eager call returned."""
    op = ir.get_op(name)
    args = _args(name, 16, 4096, torch.bfloat16)
    with op.set_priority([provider]):
        assert op.selected_impl(*args).provider == provider
        want = [t.clone() for t in _flat(op(*args))]  # default overload: inputs untouched
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            op(*args)  # warm up (compile) outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = _flat(op(*args))
    for t in captured:
        t.zero_()
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        for got, exp in zip(captured, want, strict=True):
            assert torch.equal(_bits(got), _bits(exp)), name


def test_cuda_graph_replays_read_new_inputs() -> None:
    """A replay reads what the captured input buffers hold now, not at capture time."""
    op = ir.ops.rms_norm
    x, w, eps = _args("rms_norm", 8, 4096, torch.float16)
    with op.set_priority(["triton"]):
        op(x, w, eps)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = op(x, w, eps)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        want = op(x, w, eps)
    assert torch.equal(out, want)


def test_direct_relaunch_matches_tritons_own_path() -> None:
    """Calls of one key reuse the compiled kernel; another alignment, stride or length
    compiles (or finds) its own; every result equals a launch through ``kernel[grid]``."""
    from vllm_ir_triton import direct, launch

    if not direct.ENABLED:
        pytest.skip("VLLM_IR_TRITON_DIRECT_LAUNCH=0")
    eps = 1e-6
    w = torch.randn(4096, device=DEVICE, dtype=torch.bfloat16)
    base = torch.randn(64 * 4096 + 8, device=DEVICE, dtype=torch.bfloat16)
    inputs = [
        base[: 64 * 4096].view(64, 4096),
        base[: 3 * 4096].view(3, 4096),  # same key, other rows
        base[1 : 1 + 64 * 4096].view(64, 4096),  # 2-byte aligned
        base[: 32 * 4096].view(32, 4096)[:, :4000],  # strided rows, other length
    ]
    slow = direct.Launcher(launch.rms_norm_kernel, interpreted=False, enabled=False)
    for x in inputs:
        for _ in range(2):
            got = launch.rms_norm(x, w[: x.shape[1]], eps)
        want = torch.empty_like(got)
        cfg = launch.launch_config(x.shape[1], 2, batch_invariant=False)
        slow(
            x.shape[0],
            cfg.num_warps,
            *(x, x.stride(0), x.stride(1), w, 1, want, want.stride(0), 1, x),
            *(x.shape[1], eps, True, False, cfg.block, cfg.single_pass),
        )
        assert torch.equal(got, want)
    assert len(launch._rms_norm.compiled) >= 3


@pytest.mark.parametrize("name", ["static_scaled_fp8_quant", "dynamic_per_token_fp8_quant"])
def test_scale_on_the_cpu_matches_native_whatever_ran_before(name: str) -> None:
    """A 0-d CPU scale (native accepts it) with CUDA ``x``: declined by ``triton``'s
    ``supports_args``, before or after a CUDA scale was selected for the same ``x``."""
    op = ir.get_op(name)
    x = torch.randn(4, 256, device=DEVICE)
    on_gpu, on_cpu = torch.tensor(0.5, device=DEVICE), torch.tensor(0.5)
    with op.set_priority(["triton"]):
        for order in ((on_gpu, on_cpu), (on_cpu, on_gpu)):
            ir.invalidate_caches()
            for scale in order:
                want = _flat(op.native(x, scale))
                got = _flat(op(x, scale))
                for g, w in zip(got, want, strict=True):
                    if g.dtype == torch.float8_e4m3fn:
                        assert int(fp8_steps_apart(g, w).max()) == 0, (name, scale.device)
                    else:
                        assert torch.equal(g, w), (name, scale.device)
                if scale.device.type == "cpu":
                    assert op.selected_impl(x, scale).provider == "native"


# -- a user Triton kernel traced into the compiled graph (wrap_triton) -----------------


@triton.jit
def _scale_add_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(x_ptr + offs, x * 2 + tl.load(y_ptr + offs, mask=m), mask=m)


def _launch_scale_add(x: Tensor, y: Tensor) -> None:
    n = x.numel()
    torch.library.wrap_triton(_scale_add_kernel)[(triton.cdiv(n, 128),)](x, y, n, BLOCK=128)


_OP = "triton_gpu_test_scale_add"


@pytest.fixture(scope="module")
def scale_add() -> Any:
    """An in-place op with a ``wrap_triton`` impl (traced as ``triton_kernel_wrapper_mutation``,
    which has no schema) and an opaque one; registered once, on a GPU only."""

    @ir.register_op(name=_OP, allow_inplace=True)
    def op(x: Tensor, y: Tensor) -> Tensor:
        return x * 2 + y

    @op.register_impl("hop_triton", inplace=True)
    def with_triton(x: Tensor, y: Tensor) -> Tensor:
        _launch_scale_add(x, y)
        return x

    @torch.library.custom_op("vllm_ir_triton_tests::scale_add_", mutates_args=("x",))
    def scale_add_op(x: Tensor, y: Tensor) -> None:
        x.mul_(2).add_(y)

    @op.register_impl("hop_opaque", inplace=True)
    def opaque(x: Tensor, y: Tensor) -> Tensor:
        torch.ops.vllm_ir_triton_tests.scale_add_(x, y)
        return x

    return op


def _ints(*shape: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=g).float().to(DEVICE)


_HOP_CASES: list[tuple[str, str, bool, dict[str, Any], int]] = [
    # (program, provider, x donated, Inductor options, calls)
    ("default_on_input", "hop_triton", False, {}, 1),
    ("default_on_intermediate", "hop_triton", False, {}, 1),
    ("donated_read_before", "hop_opaque", True, {}, 1),
    ("donated_cudagraphs", "hop_opaque", True, {"triton.cudagraphs": True}, 3),
]


@pytest.mark.parametrize(
    ("program", "provider", "donated", "options", "calls"),
    _HOP_CASES,
    ids=[c[0] for c in _HOP_CASES],
)
def test_compiled_kernel_writes_equal_eager(
    scale_add: Any, program: str, provider: str, donated: bool, options: dict[str, Any], calls: int
) -> None:
    """Eager and compiled agree on every output (compared after the last call) and leave
    a non-donated input as they found it, whether the impl's write is a Triton HOP or an
    opaque op, with and without Inductor's CUDA graphs."""
    from vllm_ir.testing import inductor_caches_off

    programs: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
        "default_on_input": lambda x, y: scale_add(x, y) * 1,
        "default_on_intermediate": lambda x, y: (lambda m: scale_add(m, y) + m)(x * 2),
        "donated_read_before": lambda x, y: (lambda s: scale_add.maybe_inplace(x, s + 1) + s)(
            x * 2
        ),
        "donated_cudagraphs": lambda x, y: scale_add.maybe_inplace(x, y),
    }
    fn = programs[program]
    torch._dynamo.reset()
    backend = ir.VllmIRBackend(priority={_OP: [provider]}, options=options)  # type: ignore[operator]
    compiled: Callable[[Tensor, Tensor], Tensor] = torch.compile(fn, backend=backend)  # type: ignore[arg-type]
    eager_outs, compiled_outs = [], []
    for i in range(calls):
        x0, y = _ints(64, 32, seed=i), _ints(64, 32, seed=100 + i)
        xe, xc = x0.clone(), x0.clone()
        with scale_add.set_priority([provider]), torch.no_grad():
            eager_outs.append(fn(xe, y))
        with inductor_caches_off(), torch.no_grad():
            compiled_outs.append(compiled(xc, y))
        torch.cuda.synchronize()
        if not donated:
            assert torch.equal(xc, x0), f"call {i}: compiled wrote a non-donated input"
    for i, (e, c) in enumerate(zip(eager_outs, compiled_outs, strict=True)):
        assert torch.equal(e, c), f"output of call {i} differs after {calls} calls"
