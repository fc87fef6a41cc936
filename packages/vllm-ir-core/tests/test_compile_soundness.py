"""Compiled == eager, for programs that once miscompiled.

The invariant (docs/compile.md): after vllm-ir's passes, every output equals
eager's and every tensor the program did not donate holds exactly what eager
leaves in it. Each test below is a program shape that broke it: copies that
Inductor's no-op removal turns back into their original, readers Inductor
computes after the write, storage offsets, grad mode, the lowering's trace
cache, constants, writes without a schema, functional impls that mutate
their own buffers, copies merged into an undonated input. Values are small
integers so eager and compiled agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import vllm_ir as ir
from compile_fuzz import acc, copy, scale_add
from torch import Tensor, fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from vllm_ir.compilation import LoweringPass, eliminate_clones, pass_context
from vllm_ir.compilation._lowering import ACTIVATION_CLONE_META
from vllm_ir.testing import inductor_caches_off

# -- ops and kernels: compile_fuzz's, and one impl of this module's own -----------


@scale_add.register_impl("soundness_constant")
def _scale_add_constant(x: Tensor, y: Tensor) -> Tensor:
    return x * torch.tensor([2.0, 2.0, 2.0]) + y  # a graph constant of the rows' width


INPLACE = {"fuzz_scale_add": ["fuzz_inplace"]}


# -- the check ---------------------------------------------------------------


def compare(
    fn: Callable[..., Any],
    args: Sequence[Tensor],
    priority: dict[str, list[str]],
    *,
    donated: Sequence[int] = (),
    dynamic: bool = False,
) -> ir.VllmIRBackend:
    """Run ``fn`` eager and compiled on copies of ``args``: outputs equal, and
    every argument not in ``donated`` left as eager leaves it."""
    eager_args = [a.clone() for a in args]
    with ir.IrOpPriorityConfig(**priority).scope(), torch.no_grad():
        want = fn(*eager_args)
    torch._dynamo.reset()
    backend = ir.VllmIRBackend(priority=priority)
    compiled_args = [a.clone() for a in args]
    with inductor_caches_off(), torch.no_grad():
        got = torch.compile(fn, backend=backend, dynamic=dynamic or None)(*compiled_args)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    for i, (g, w) in enumerate(zip(compiled_args, eager_args, strict=True)):
        if i not in donated:
            torch.testing.assert_close(g, w, atol=0, rtol=0, msg=f"argument {i} changed")
    return backend


def arange(*shape: int) -> Tensor:
    return torch.arange(float(torch.Size(shape).numel())).view(*shape)


# -- 1. donating a copy ------------------------------------------------------


def donate_copies(x: Tensor, y: Tensor) -> tuple[Tensor, ...]:
    copies = (
        x.clone(),
        torch.cat([x]),
        x.repeat(1, 1),
        F.pad(x, (0, 0)),
        torch.empty_like(x).copy_(x),
        x.to(torch.float32, copy=True),
        copy(x),  # a copy returned by a functional impl
    )
    return tuple(scale_add.maybe_inplace(c, y) for c in copies)


def test_donating_a_copy_leaves_the_original() -> None:
    backend = compare(
        donate_copies,
        [arange(2, 3), torch.ones(2, 3)],
        {**INPLACE, "fuzz_copy": ["fuzz_clone"]},
    )
    assert backend.pass_contexts[0].clones_kept  # the copies' originals were protected


class Stateful(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", arange(2, 3))

    def forward(self, y: Tensor) -> Tensor:
        return scale_add.maybe_inplace(self.state.clone(), y)


def test_donating_a_copy_of_a_buffer_leaves_the_buffer() -> None:
    y = torch.ones(2, 3)
    eager, compiled_model = Stateful(), Stateful()
    with scale_add.set_priority(["fuzz_inplace"]), torch.no_grad():
        want = [eager(y), eager(y)]
    torch._dynamo.reset()
    compiled = torch.compile(compiled_model, backend=ir.VllmIRBackend(priority=INPLACE))
    with inductor_caches_off(), torch.no_grad():
        got = [compiled(y), compiled(y)]
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    torch.testing.assert_close(compiled_model.state, arange(2, 3), atol=0, rtol=0)


# -- 2. reads before the write -----------------------------------------------


def read_then_donate(x: Tensor) -> Tensor:
    s = x * 2
    return scale_add.maybe_inplace(x, s + 1) + s


def read_mm_then_default(x: Tensor) -> Tensor:
    m = x @ (torch.eye(3) * 2)
    s = m * 2
    return scale_add(m, s + 1) + s


def accumulate_then_donate(acc_: Tensor, x: Tensor) -> Tensor:
    acc_[1:3] += x
    return scale_add.maybe_inplace(x, x * 0 + 1)


@pytest.mark.parametrize(
    ("fn", "shapes", "donated"),
    [
        (read_then_donate, [(2, 3)], [0]),
        (read_mm_then_default, [(2, 3)], []),
        (accumulate_then_donate, [(4, 3), (2, 3)], [1]),
    ],
    ids=["donated", "default-overload-on-mm", "input-mutation"],
)
def test_reads_before_the_write_see_the_old_values(
    fn: Callable[..., Tensor], shapes: list[tuple[int, ...]], donated: list[int]
) -> None:
    args = [arange(*s) for s in shapes]
    if fn is accumulate_then_donate:
        args[0] = torch.zeros(4, 3)
    backend = compare(fn, args, INPLACE, donated=donated)
    assert any(
        "after it" in r or "read after" in r for r in backend.pass_contexts[0].clones_kept.values()
    )


# -- 3. storage offsets ------------------------------------------------------


def as_strided_graph(write: bool) -> fx.GraphModule:
    aten = torch.ops.aten
    g = fx.Graph()
    x = g.placeholder("x")
    y = g.placeholder("y")
    c = g.call_function(aten.clone.default, (x,))
    c.meta[ACTIVATION_CLONE_META] = {
        "op": "soundness",
        "argument": "x",
        "donated": True,
        "donated_inputs": frozenset({"x"}),
    }
    v = g.call_function(aten.as_strided.default, (c, [4, 6], [6, 1], 0))
    if write:
        g.call_function(torch.ops.vllm_ir_fuzz.scale_add_.default, (v, y))
        g.output((c,))
    else:
        g.output((g.call_function(aten.mul.Tensor, (v, 1.0)),))
    return fx.GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize("write", [True, False], ids=["written", "never-written"])
def test_a_clone_of_an_offset_view_stays(write: bool) -> None:
    gm = as_strided_graph(write)
    base = arange(6, 6)
    mode = FakeTensorMode()
    FakeTensorProp(gm, mode=mode).propagate(
        mode.from_tensor(base[1:5]), mode.from_tensor(torch.ones(4, 6))
    )
    removed, kept = eliminate_clones(gm.graph)
    assert removed == 0
    assert any("storage offset" in reason for reason in kept.values()), kept


def donate_rows(x: Tensor, y: Tensor) -> Tensor:
    return scale_add.maybe_inplace(x[1:5], y)


def test_donated_row_slice_writes_only_its_rows() -> None:
    base, y = arange(6, 6), torch.ones(4, 6)
    want_base = base.clone()
    with scale_add.set_priority(["fuzz_strided"]), torch.no_grad():
        want = donate_rows(want_base, y)
    torch._dynamo.reset()
    backend = ir.VllmIRBackend(priority={"fuzz_scale_add": ["fuzz_strided"]})
    got_base = base.clone()
    with inductor_caches_off(), torch.no_grad():
        got = torch.compile(donate_rows, backend=backend)(got_base, y)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    torch.testing.assert_close(got_base[0], base[0], atol=0, rtol=0)
    torch.testing.assert_close(got_base[5], base[5], atol=0, rtol=0)


def _rope_inplace(
    query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool = True
) -> tuple[Tensor, Tensor]:
    q, k = ir.ops.rotary_embedding.native(query, key, cos, sin, is_neox)
    return query.copy_(q), key.copy_(k)


def rope_on_a_fused_projection(x: Tensor, w: Tensor, cos: Tensor, sin: Tensor) -> Any:
    qkv = x @ w
    q, k, v = qkv.split([16, 8, 8], dim=-1)
    rope = ir.ops.rotary_embedding.maybe_inplace
    q, k = rope(q.unflatten(-1, (2, 8)), k.unflatten(-1, (1, 8)), cos, sin, True)
    return q * 1, k * 1, v * 1, qkv[:, 24:] * 2  # v read after, also sliced after


def test_donating_slices_of_one_buffer_leaves_the_sibling_slice() -> None:
    """vLLM's attention inputs (compile-v4 r03): RoPE donates q and k, views of one
    qkv projection, and v is read after. v shares the storage, not the elements:
    it compiles (it was refused), donates, and v keeps its values."""
    ir.ops.rotary_embedding.register_impl("soundness_inplace", inplace=True)(_rope_inplace)
    try:
        args = [arange(6, 16) % 5, arange(16, 32) % 3 - 1, arange(6, 8) % 2, arange(6, 8) % 3]
        backend = compare(
            rope_on_a_fused_projection,
            args,
            {"rotary_embedding": ["soundness_inplace"]},
            dynamic=True,
        )
    finally:
        ir.ops.rotary_embedding.unregister_impl("soundness_inplace")
    ctx = backend.pass_contexts[0]
    assert [d.argument for d in ctx.donations] == ["query", "key"]
    assert not ctx.declined_activations


# -- 4. grad mode -------------------------------------------------------------


def donate_under_grad(x: Tensor, y: Tensor) -> Tensor:
    return scale_add.maybe_inplace(x, y) * 1


def saved_by_an_earlier_graph(x: Tensor, y: Tensor) -> Tensor:
    pre = x * x
    torch._dynamo.graph_break()
    return pre + scale_add.maybe_inplace(x, y)


@pytest.mark.parametrize(
    ("fn", "x_grad", "y_grad"),
    [
        (donate_under_grad, True, False),
        (donate_under_grad, False, True),
        (saved_by_an_earlier_graph, True, False),
    ],
    ids=["leaf-requires-grad", "only-y-requires-grad", "saved-by-an-earlier-graph"],
)
def test_autograd_inputs_are_never_donated(
    fn: Callable[..., Tensor], x_grad: bool, y_grad: bool
) -> None:
    results = []
    for compiled in (False, True):
        x = arange(2, 3).requires_grad_(x_grad)
        y = torch.full((2, 3), 2.0).requires_grad_(y_grad)
        run = fn
        backend = ir.VllmIRBackend(priority=INPLACE)
        if compiled:
            torch._dynamo.reset()
            run = torch.compile(fn, backend=backend)
        with scale_add.set_priority(["fuzz_inplace"]), inductor_caches_off():
            out = run(x, y)
        grads = torch.autograd.grad(out.sum(), [t for t in (x, y) if t.requires_grad])
        results.append((x.detach().clone(), out.detach(), grads))
    (x_e, out_e, g_e), (x_c, out_c, g_c) = results
    torch.testing.assert_close(x_c, arange(2, 3), atol=0, rtol=0)
    torch.testing.assert_close(x_e, x_c, atol=0, rtol=0)
    torch.testing.assert_close(out_c, out_e, atol=0, rtol=0)
    torch.testing.assert_close(g_c, g_e, atol=0, rtol=0)
    assert backend.pass_contexts[-1].declined


# -- 5.-6. the lowering's trace ---------------------------------------------


def two_row_blocks(a: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    return scale_add(a[0:2], y), scale_add(a[2:4], y)


def test_trace_cache_keys_on_storage_offset() -> None:
    compare(
        two_row_blocks,
        [arange(4, 6), torch.zeros(2, 6)],
        {"fuzz_scale_add": ["fuzz_offset_read"]},
    )


def test_impl_creating_a_tensor_constant_compiles() -> None:
    compare(
        lambda x, y: scale_add(x, y),
        [arange(2, 3), torch.ones(2, 3)],
        {"fuzz_scale_add": ["soundness_constant"]},
    )


TABLE = torch.tensor([2.0, 3.0])  # a module-level lookup table
CALLS = torch.zeros(1)


class _Holder:
    def __init__(self) -> None:
        self.offsets = torch.tensor([[1.0, 0.0, 1.0]])


HOLDER = _Holder()


def _reading_captured_tensors() -> Callable[[Tensor, Tensor], Tensor]:
    row = torch.tensor([1.0, 2.0, 3.0])

    def impl(x: Tensor, y: Tensor) -> Tensor:
        return x * TABLE[0] + y * row + HOLDER.offsets

    return impl


scale_add.register_impl("soundness_captured")(_reading_captured_tensors())


@scale_add.register_impl("soundness_writes_captured")
def _writes_captured(x: Tensor, y: Tensor) -> Tensor:
    CALLS.add_(1)
    return x * 2 + y


def test_impl_reading_tensors_it_did_not_receive_compiles() -> None:
    """A module-level table, a closure's tensor, an object's attribute (compile-v4
    r04: the trace refused real tensors); they become constants of the graph."""
    compare(
        lambda x, y: scale_add(x, y),
        [arange(2, 3), torch.ones(2, 3)],
        {"fuzz_scale_add": ["soundness_captured"]},
    )


def test_impl_writing_a_tensor_it_did_not_receive_is_an_error() -> None:
    gm = make_fx(lambda x, y: scale_add(x, y), tracing_mode="fake")(arange(2, 3), arange(2, 3))
    lowering = LoweringPass({"fuzz_scale_add": ["soundness_writes_captured"]})
    with pass_context(), pytest.raises(RuntimeError, match="writes a tensor it did not receive"):
        lowering.pre(gm.graph)


# -- 7. writes without a schema ---------------------------------------------


def test_a_schemaless_op_counts_as_writing_its_tensors() -> None:
    """A Python-level op has no schema to declare its writes: the clone of a
    non-donated input it may write must stay."""

    def write_somehow(t: Tensor) -> None:
        t.mul_(2)

    g = fx.Graph()
    x = g.placeholder("x")
    c = g.call_function(torch.ops.aten.clone.default, (x,))
    c.meta[ACTIVATION_CLONE_META] = {"op": "soundness", "argument": "x", "donated": False}
    g.call_function(write_somehow, (c,))
    g.output((g.call_function(torch.ops.aten.mul.Tensor, (c, 1.0)),))
    gm = fx.GraphModule(torch.nn.Module(), g)
    mode = FakeTensorMode()
    FakeTensorProp(gm, mode=mode).propagate(mode.from_tensor(arange(2, 3)))
    removed, kept = eliminate_clones(gm.graph)
    assert removed == 0, kept
    gm.recompile()
    x0 = arange(2, 3)
    (out,) = gm(x0)
    torch.testing.assert_close(x0, arange(2, 3), atol=0, rtol=0)
    torch.testing.assert_close(out, arange(2, 3) * 2, atol=0, rtol=0)


def test_a_triton_kernel_write_keeps_the_clone() -> None:
    """``wrap_triton`` launches appear as ``triton_kernel_wrapper_mutation``,
    a higher-order op without a schema."""
    triton = pytest.importorskip("triton")
    tl = pytest.importorskip("triton.language")

    @triton.jit
    def scale_add_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m)
        tl.store(x_ptr + offs, x * 2 + tl.load(y_ptr + offs, mask=m), mask=m)

    def traced_like_the_lowering(x: Tensor, y: Tensor) -> Tensor:
        c = x.clone()
        n = c.numel()
        torch.library.wrap_triton(scale_add_kernel)[(triton.cdiv(n, 128),)](c, y, n, BLOCK=128)
        return c * 1

    with FakeTensorMode():
        fx_, fy_ = torch.empty(4, 6, device="cuda"), torch.empty(4, 6, device="cuda")
    gm = make_fx(traced_like_the_lowering, tracing_mode="fake")(fx_, fy_)
    for n in gm.graph.nodes:
        if n.target is torch.ops.aten.clone.default:
            n.meta[ACTIVATION_CLONE_META] = {"op": "soundness", "argument": "x", "donated": False}
    removed, kept = eliminate_clones(gm.graph)
    assert removed == 0, kept


# -- 8. functional impls with internal in-place ops ---------------------------


def test_functional_impl_mutating_its_own_copy() -> None:
    compare(
        lambda x, y: scale_add(x, y) + x,
        [arange(2, 3), torch.ones(2, 3)],
        {"fuzz_scale_add": ["fuzz_copy_then_inplace"]},
    )


@ir.register_op(name="soundness_bad_functional")
def bad_functional(x: Tensor) -> Tensor:
    return x * 2


@bad_functional.register_impl("soundness_writes_input")
def _writes_its_input(x: Tensor) -> Tensor:
    return x.mul_(2)


def test_functional_impl_writing_its_input_is_an_error() -> None:
    def f(x: Tensor) -> Tensor:
        return bad_functional(x)

    torch._dynamo.reset()
    backend = ir.VllmIRBackend(priority={"soundness_bad_functional": ["soundness_writes_input"]})
    with (
        inductor_caches_off(),
        torch.no_grad(),
        pytest.raises(Exception, match=r"writes its argument 'x'; register it with inplace=True"),
    ):
        torch.compile(f, backend=backend)(arange(2, 3))


# -- 9. an unwritten output, then donated -------------------------------------


def unwritten_then_donated(a: Tensor, y: Tensor) -> Tensor:
    x, s = acc(a, y)
    return scale_add.maybe_inplace(x, s)


def test_unwritten_output_then_donated_leaves_the_input() -> None:
    backend = compare(
        unwritten_then_donated,
        [arange(2, 3), torch.ones(2, 3)],
        {"fuzz_acc": ["fuzz_inplace"], **INPLACE},
    )
    assert backend.pass_contexts[0].clones_kept


# -- found by the differential fuzzer (tests/compile_fuzz.py) ----------------


def same_tensor_twice_then_two(a: Tensor, b: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    # the first call's trace reads one placeholder for x and y; the second call
    # has the same argument metadata and must not reuse it (it would compute b * 2 + b)
    return scale_add(c, c), scale_add(a, b)


@pytest.mark.parametrize("impl", ["fuzz_inplace", "native"])
def test_trace_cache_keys_on_repeated_arguments(impl: str) -> None:
    compare(
        same_tensor_twice_then_two,
        [arange(2, 3), torch.ones(2, 3), arange(2, 3) - 3],
        {"fuzz_scale_add": [impl]},
    )


def offset_read_of_an_intermediate_slice(a: Tensor) -> Tensor:
    rows = (a * 2 + 1)[1:3]  # storage offset 3, in a buffer Inductor makes
    return scale_add(rows, torch.ones_like(rows))


def test_offset_reading_impl_on_a_slice_of_an_intermediate() -> None:
    """Inductor (torch 2.13) miscompiles ``as_strided`` with an absolute offset
    on a slice of a buffer it computes, without vllm-ir too:
    ``torch.compile(lambda a: (a * 2 + 1)[1:3].as_strided((2, 3), (3, 1), 3))``
    reads rows 2..3. The inlined impl takes exactly such a view; the
    absolute-views pass takes it from the slice's root instead."""
    backend = compare(
        offset_read_of_an_intermediate_slice,
        [arange(4, 3)],
        {"fuzz_scale_add": ["fuzz_offset_read"]},
    )
    assert backend.pass_contexts[0].views_rebased == 1


def as_strided_of_an_intermediate_slice(a: Tensor) -> Tensor:
    rows = (a * 2 + 1)[1:3]
    return rows.as_strided(rows.size(), rows.stride(), rows.storage_offset()) + 1


def test_as_strided_of_a_slice_of_an_intermediate_with_dynamic_shapes() -> None:
    """Fuzz seed 1183: the program's own view, no IR op needed (plain
    ``torch.compile`` reads the wrong rows as well)."""
    compare(as_strided_of_an_intermediate_slice, [arange(4, 3)], {}, dynamic=True)


def as_strided_of_a_dtype_view_of_a_row_slice(a: Tensor) -> Tensor:
    words = a[1:].view(torch.int16)[1:]  # an implicit offset, counted in int16 elements
    return words.as_strided((2, 3), (1, 2)) * 1


@pytest.mark.parametrize("dynamic", [False, True])
def test_as_strided_of_a_dtype_view_of_an_input_row_slice(dynamic: bool) -> None:
    """compile-v4 r06: reinterpreting a row-slice input would place the view at the
    slice's start, where Inductor's own dtype view may not start: left to Inductor,
    as plain ``torch.compile`` does, and right wherever plain Inductor is (torch
    2.11's Inductor reads this program wrong itself: the offset bug of
    ``_inductor_compat``)."""
    fn = as_strided_of_a_dtype_view_of_a_row_slice
    x = arange(9, 8)[1:]  # a graph input at storage offset 8
    want = fn(x)
    results = {}
    for backend in (ir.VllmIRBackend(), "inductor"):
        torch._dynamo.reset()
        with inductor_caches_off(), torch.no_grad():
            results[str(backend)] = torch.equal(
                torch.compile(fn, backend=backend, dynamic=dynamic)(x), want
            )
    if not results["inductor"]:
        pytest.skip(f"torch {torch.__version__}'s Inductor reads this program wrong too")
    assert all(results.values()), results


def offset_read_of_a_later_slice(a: Tensor) -> Tensor:
    rows = (a * 2 + 1)[2:4]  # storage offset 2 * columns: a product of symbols
    return scale_add(rows, torch.ones_like(rows))


def test_offset_reading_impl_on_an_intermediate_slice_with_dynamic_shapes() -> None:
    compare(
        offset_read_of_a_later_slice,
        [arange(5, 3)],
        {"fuzz_scale_add": ["fuzz_offset_read"]},
        dynamic=True,
    )


def test_offset_reading_impl_on_a_row_slice_input_with_dynamic_shapes() -> None:
    """Fuzz seeds 1115 and 1185: traced with dynamic shapes, the impl's
    ``x.storage_offset()`` became ``aten.sym_storage_offset(x)``, which
    Inductor (torch 2.13) reads as 0: the impl read the rows before the slice.
    The offset is one row (a symbol shared with the column count) or two (a
    symbol of its own)."""

    def fn(x: Tensor) -> Tensor:
        return scale_add(x, torch.ones_like(x))

    torch._dynamo.reset()
    backend = ir.VllmIRBackend(priority={"fuzz_scale_add": ["fuzz_offset_read"]})
    compiled = torch.compile(fn, backend=backend, dynamic=True)
    with scale_add.set_priority(["fuzz_offset_read"]), inductor_caches_off():
        for first, rows in ((1, 4), (2, 5)):
            base = arange(rows + 2, 8)
            got, want = compiled(base[first : first + rows]), fn(base[first : first + rows])
            torch.testing.assert_close(got, want, atol=0, rtol=0, msg=f"rows {first}..")


# -- what still goes: donation passes on through a chain ---------------------


def test_a_chain_of_donations_needs_no_clones() -> None:
    def chain(x: Tensor, y: Tensor) -> Tensor:
        h = scale_add.maybe_inplace(x, y)
        return scale_add.maybe_inplace(h, y)

    backend = compare(chain, [arange(2, 3), torch.ones(2, 3)], INPLACE, donated=[0])
    ctx = backend.pass_contexts[0]
    assert ctx.clones_removed == ctx.clones_inserted == 2, ctx.clones_kept


@pytest.fixture(autouse=True)
def _no_leaked_priorities() -> Iterator[None]:
    yield
    torch._dynamo.reset()


# -- programs torch itself compiles wrongly (compilation/_upstream_hazards.py) ---


def strided_view_of_a_written_input(x: Tensor) -> Tensor:
    rows = x.as_strided((2, x.shape[1]), x.stride(), x.storage_offset() + x.stride(0))
    x.add_(1)  # AOTAutograd replays `rows` on x + 1 with x's absolute offset
    return rows * 2 + 1


def test_as_strided_view_of_a_written_input_with_dynamic_shapes_runs_eagerly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Fuzz seeds 1302 and 1800: plain ``torch.compile(dynamic=True)`` reads the
    rows after the view; the backend runs such a graph eagerly and says why."""
    torch._dynamo.reset()
    backend = ir.VllmIRBackend()
    compiled = torch.compile(strided_view_of_a_written_input, backend=backend, dynamic=True)
    want_base, got_base = arange(6, 8), arange(6, 8)
    with inductor_caches_off():
        got = compiled(got_base[1:5])
    want = strided_view_of_a_written_input(want_base[1:5])
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    torch.testing.assert_close(got_base, want_base, atol=0, rtol=0)
    assert "writes in place (add_)" in (backend.pass_contexts[0].eager_fallback or "")
