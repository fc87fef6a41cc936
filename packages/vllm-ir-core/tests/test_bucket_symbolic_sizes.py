"""Bucket tables under symbolic sizes a ``torch.cond`` branch may not carry.

With a dynamic token count spanning several buckets, the lowering branches per
bucket (``bucket_dispatch="branches"``, or ``"graphs"`` where it cannot cut the
graph). Every symbolic size plain Inductor accepts must compile and equal eager:
unbacked counts, products, floor divisions, non-contiguous strides. Where a
branch cannot carry them, the node selects its impl at run time (under the
backend's priorities) with one log line. Each test compiles with Inductor's
caches on (then a second time, served from them) and off.

The impls tag their outputs (``+ K`` on integer-valued floats), so compiled ==
eager bit for bit says which impl ran.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import vllm_ir as ir
from torch import Tensor
from vllm_ir.compilation._lowering import RUNTIME_SELECTED
from vllm_ir.testing import inductor_caches_off

pytestmark = pytest.mark.usefixtures("dynamo_reset_after")

RUNTIME_LOG = "selects its impl at run time"


def scaled(x: Tensor, factor: float) -> Tensor:
    """The op under test: ``x * factor``; each impl adds its own tag."""
    return x * factor


def _t1(x: Tensor, factor: float) -> Tensor:
    return x * factor + 1


def _t2(x: Tensor, factor: float) -> Tensor:
    return x * factor + 2


def _storage_reading(x: Tensor, factor: float) -> Tensor:
    # re-views its input at an absolute storage offset, as a kernel handed a pointer does
    return x.as_strided(x.size(), x.stride(), x.storage_offset()) * factor + 3


def _branchy(x: Tensor, factor: float) -> Tensor:
    # branches on the token count inside its bucket: a guard when traced
    return x * factor + (4 if x.shape[0] <= 8 else 5)


@pytest.fixture
def tagged(make_op: Callable[..., ir.IrOp]) -> ir.IrOp:
    op = make_op(scaled)
    impls = {"t1": _t1, "t2": _t2, "strided": _storage_reading, "branchy": _branchy}
    for name, fn in impls.items():
        op.register_impl(name)(fn)
    return op


def _rope_tagged(
    query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool = True
) -> tuple[Tensor, Tensor]:
    q, k = ir.ops.rotary_embedding.native(query, key, cos, sin, is_neox)
    return q + 100.0, k - 100.0


ROPE_TAGGED = "test_rope_tagged"
ROPE_TABLE = [{"max_tokens": 8, "priority": [ROPE_TAGGED]}, {"priority": ["native"]}]


@pytest.fixture
def stand_ins() -> Iterator[None]:
    """An in-place fused_add_rms_norm kernel, and a tagged functional RoPE impl."""
    import stand_in_kernels as sk

    sk.register()
    ir.ops.rotary_embedding.register_impl(ROPE_TAGGED)(_rope_tagged)
    try:
        yield
    finally:
        ir.ops.rotary_embedding.unregister_impl(ROPE_TAGGED)
        sk.unregister()


@pytest.fixture(params=["caches-on", "caches-off"])
def caches(request: pytest.FixtureRequest) -> Iterator[str]:
    """Inductor's FX graph and AOTAutograd caches on (the default), or off."""
    torch._dynamo.reset()
    off = request.param == "caches-off"
    with inductor_caches_off() if off else contextlib.nullcontext():
        yield request.param


def _ints(*shape: int) -> Tensor:
    return torch.randint(-4, 5, shape).float()


def _check(
    fn: Callable[..., Any],
    make_backend: Callable[[], ir.VllmIRBackend],
    calls: list[tuple[Any, ...]],
    scope: Callable[[], Any],
    caches: str,
    exact: bool = True,
) -> list[ir.VllmIRBackend]:
    """Compile ``fn`` (dynamic sizes) and run ``calls``: each equals eager under
    ``scope()`` (the tables). With caches on, again after a Dynamo reset, so the
    second compile is served from Inductor's cache. Returns the backends."""
    backends = []
    for _ in range(2 if caches == "caches-on" else 1):
        torch._dynamo.reset()
        backend = make_backend()
        backends.append(backend)
        compiled = torch.compile(fn, backend=backend, dynamic=True)
        for args in calls:
            with scope():
                want = fn(*args)
                got = compiled(*args)
            want = want if isinstance(want, tuple) else (want,)
            got = got if isinstance(got, tuple) else (got,)
            for g, w in zip(got, want, strict=True):
                if exact:
                    torch.testing.assert_close(g, w, rtol=0, atol=0)
                else:  # lowered native against eager native
                    torch.testing.assert_close(g, w)
    return backends


def _runtime_nodes(backend: ir.VllmIRBackend, op: ir.IrOp) -> list[str]:
    return [
        node
        for ctx in backend.pass_contexts
        for node, provider in ctx.selected_impls.get(op.name, {}).items()
        if provider == RUNTIME_SELECTED
    ]


def test_branch_reading_storage_of_a_column_major_input(tagged: ir.IrOp, caches: str) -> None:
    """compile-v5 r04: a bucket's impl re-views its input with ``as_strided``; the input
    is column-major. Its branch gets a contiguous copy, which Inductor lowered
    column-major (``clone`` ignores its memory format there) while the branch
    asserted contiguous strides."""
    table = [{"max_tokens": 8, "priority": ["strided"]}, {"priority": ["t2"]}]
    w = _ints(16)

    def fn(x: Tensor) -> Tensor:
        return tagged(x, 2.0) * w

    _check(
        fn,
        lambda: ir.VllmIRBackend(priority={tagged.name: table}, bucket_dispatch="branches"),
        [(_ints(16, n).t(),) for n in (5, 12, 3)],
        lambda: tagged.set_priority(table),
        caches,
    )


@pytest.mark.parametrize("dispatch", ["graphs", "branches"])
def test_unbacked_token_count_selects_at_run_time(
    tagged: ir.IrOp, caches: str, dispatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """compile-v5 r05: ``x[:k]`` with ``k = cnt.item()``, a bucketed table: no graph
    input gives the unbacked count to a branch (and ``torch.cond`` would give its
    output a fresh one). The node selects at run time, with the backend's table
    even where the caller has none in scope, and says so once."""
    table = [{"max_tokens": 8, "priority": ["t1"]}, {"priority": ["t2"]}]

    def fn(x: Tensor, cnt: Tensor) -> Tensor:
        k = int(cnt.item())
        torch._check(k >= 0)
        torch._check(k <= x.shape[0])
        return tagged(x[:k], 2.0) * 1

    x = _ints(20, 8)
    with (
        torch._dynamo.config.patch(capture_scalar_outputs=True),
        caplog.at_level(logging.WARNING, logger="vllm_ir"),
    ):
        backends = _check(
            fn,
            lambda: ir.VllmIRBackend(priority={tagged.name: table}, bucket_dispatch=dispatch),
            [(x, torch.tensor(k)) for k in (5, 12, 8, 9)],
            lambda: tagged.set_priority(table),
            caches,
        )
        # no table in the caller's scope: the compiled graph still selects by the backend's
        got = torch.compile(fn, backend=backends[-1], dynamic=True)(x, torch.tensor(5))
    assert torch.equal(got, x[:5] * 2 + 1)
    fresh = [b for b in backends if not all(c.from_cache for c in b.pass_contexts)]
    for backend in fresh:
        assert _runtime_nodes(backend, tagged) == [tagged.name]
    lines = [r for r in caplog.records if RUNTIME_LOG in r.getMessage()]
    assert len(lines) == len(fresh)  # one line per node compiled, none per call


def test_impl_branching_on_the_count_in_a_size_range_graph(tagged: ir.IrOp, caches: str) -> None:
    """compile-v5 r08: ``bucket_dispatch="graphs"``; an impl branching on the token
    count is traced in the graph for 10..64 tokens at an example count of 8, which
    guards ``tokens <= 8``: the next node's count then has no value in that range
    (an IndexError). Such a node selects at run time; the guard recompiles."""
    table = [
        {"max_tokens": 1, "priority": ["branchy"]},
        {"max_tokens": 9, "priority": ["t1"]},
        {"max_tokens": 64, "priority": ["branchy"]},
        {"priority": ["t1"]},
    ]

    def fn(x: Tensor) -> Tensor:
        return tagged(tagged(x, 2.0), 3.0) * 1

    _check(
        fn,
        lambda: ir.VllmIRBackend(priority={tagged.name: table}, bucket_dispatch="graphs"),
        [(_ints(n, 8),) for n in (8, 40, 64, 5, 63, 17)],
        lambda: tagged.set_priority(table),
        caches,
    )


def _fa_inplace_table() -> list[dict[str, Any]]:
    import stand_in_kernels as sk

    return [{"max_tokens": 8, "priority": [sk.INPLACE]}, {"priority": ["native"]}]


@contextlib.contextmanager
def _tables(tables: dict[str, list[dict[str, Any]]]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for name, table in tables.items():
            stack.enter_context(getattr(ir.ops, name).set_priority(table))
        yield


@pytest.mark.slow
def test_rope_chain_then_inplace_norm_on_a_floordiv_head_size(stand_ins: None, caches: str) -> None:
    """compile-v5 (described): RoPE twice, then ``fused_add_rms_norm.maybe_inplace``
    on ``(tokens, heads, hidden // heads)`` heads of a dynamic hidden size and
    head count, every op bucketed, one bucket of the norm in place. The in-place
    branch returns the residual, whose head size is another symbol than the
    native branch's ``hidden // heads``: ``torch.cond`` gave the output a fresh
    unbacked size, never bound (``PendingUnbackedSymbolNotFound``). The norm
    selects at run time; the RoPE nodes still branch."""
    rope, fa = ir.ops.rotary_embedding, ir.ops.fused_add_rms_norm
    tables = {rope.name: ROPE_TABLE, fa.name: _fa_inplace_table()}

    def fn(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, res: Tensor) -> tuple[Tensor, ...]:
        heads = k.shape[1]
        qh = q.view(q.shape[0], heads, q.shape[1] // heads)
        q1, k1 = rope(qh, k, cos, sin)
        q2, k2 = rope(q1, k1, cos, sin)
        o, r = fa.maybe_inplace(q2, res, None, 1e-6)
        return o * 1, r * 1, k2 * 1

    def args(n: int) -> tuple[Tensor, ...]:  # partial rotary: 4 of 8 channels
        return (_ints(n, 32), _ints(n, 4, 8), _ints(n, 4), _ints(n, 4), _ints(n, 4, 8))

    backends = _check(
        fn,
        lambda: ir.VllmIRBackend(priority=tables, bucket_dispatch="branches"),
        [args(n) for n in (17, 5, 12, 3)],
        lambda: _tables(tables),
        caches,
        exact=False,
    )
    for backend in backends:
        for ctx in backend.pass_contexts:
            if not ctx.from_cache:
                assert set(ctx.selected_impls[fa.name].values()) == {RUNTIME_SELECTED}
                assert RUNTIME_SELECTED not in ctx.selected_impls[rope.name].values()


@pytest.mark.slow
def test_rope_on_a_stack_of_qkv_slices_then_gelu(stand_ins: None, caches: str) -> None:
    """compile-v5 (described): fused-qkv RoPE on a ``torch.stack`` of two qkv slices
    then ``unflatten`` (head count and size symbols whose products are strides), a
    bucketed RoPE table, GELU after."""
    rope = ir.ops.rotary_embedding
    tables = {rope.name: ROPE_TABLE}

    def fn(qkv: Tensor, cos: Tensor, sin: Tensor, shape: Tensor) -> tuple[Tensor, ...]:
        heads, size = shape.shape
        q = qkv[:, : heads * size]
        k = qkv[:, heads * size : 2 * heads * size]
        s = torch.stack((q, k), dim=0).unflatten(-1, (heads, size))
        a, b = rope(s[0], s[1], cos, sin)
        return torch.nn.functional.gelu(a) * 1, torch.nn.functional.gelu(b) * 1

    def args(n: int) -> tuple[Tensor, ...]:
        return (_ints(n, 3 * 4 * 8), _ints(n, 8), _ints(n, 8), torch.zeros(4, 8))

    _check(
        fn,
        lambda: ir.VllmIRBackend(priority=tables, bucket_dispatch="branches"),
        [args(n) for n in (17, 5, 12, 3)],
        lambda: _tables(tables),
        caches,
        exact=False,
    )


def test_interleaved_rows_donated_together(stand_ins: None, caches: str) -> None:
    """compile-v5 (described): ``fused_add_rms_norm.maybe_inplace(buf[0::2],
    buf[1::2])``, one bucket in place: the halves have ``(s + 1) // 2`` and
    ``s // 2`` rows, equal under a guard but not as expressions, so the in-place
    branch's residual and native's sum differ in size (``PendingUnbackedSymbolNotFound``
    with ``((s54 + 1)//2)``). The node selects at run time."""
    fa = ir.ops.fused_add_rms_norm
    tables = {fa.name: _fa_inplace_table()}
    w = _ints(16)

    def fn(buf: Tensor) -> tuple[Tensor, Tensor]:
        buf = buf.clone()  # the program's own buffer, donated row by row
        o, r = fa.maybe_inplace(buf[0::2], buf[1::2], w, 1e-6)
        return o * 1, r * 1

    _check(
        fn,
        lambda: ir.VllmIRBackend(priority=tables, bucket_dispatch="branches"),
        [(_ints(2 * n, 16),) for n in (17, 5, 12, 3)],
        lambda: _tables(tables),
        caches,
        exact=False,
    )


def test_unbacked_count_within_one_bucket_whose_impl_branches_on_it(
    tagged: ir.IrOp, caches: str
) -> None:
    """An unbacked count known to be at most 8 reaches one bucket, whose impl branches
    on ``rows <= 4``, which the count's range does not decide: tracing it raised a
    data-dependent guard error. The node selects at run time."""

    def branchy2(x: Tensor, factor: float) -> Tensor:
        return x * factor + (6 if x.shape[0] <= 4 else 7)

    tagged.register_impl("branchy2")(branchy2)
    table = [{"max_tokens": 8, "priority": ["branchy2"]}, {"priority": ["t2"]}]

    def fn(x: Tensor, cnt: Tensor) -> Tensor:
        k = int(cnt.item())
        torch._check(k >= 0)
        torch._check(k <= 8)
        return tagged(x[:k], 2.0) * 1

    x = _ints(20, 8)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        _check(
            fn,
            lambda: ir.VllmIRBackend(priority={tagged.name: table}, bucket_dispatch="branches"),
            [(x, torch.tensor(k)) for k in (3, 7)],
            lambda: tagged.set_priority(table),
            caches,
        )
