"""The eager fast path is a cache of select(): it runs exactly that impl, once.

One test per way the cache used to disagree with ``select()``: impl errors
retried, facts missing from the key, stale stores after a priority change,
the selection mode and environment, argument types, unbounded growth.
"""

from __future__ import annotations

import gc
import threading
import traceback
import weakref
from collections.abc import Callable

import pytest
import torch
import vllm_ir as ir
from torch import Tensor
from vllm_ir._base import cache
from vllm_ir._schema.layout import rows_flatten_free
from vllm_ir._selection import eager
from vllm_ir.priority import add_platform_defaults, remove_platform_defaults

Ran = list[str]


def _recording(op: ir.IrOp, ran: Ran, provider: str, supports: Callable[..., bool] | None) -> None:
    """Register ``provider`` running the native function and recording that it ran."""

    def impl(*args):  # type: ignore[no-untyped-def]
        ran.append(provider)
        return op.native(*args)

    impl.__signature__ = op.signature  # type: ignore[attr-defined]
    op.register_impl(provider, supports_args=supports)(impl)


def _ran(op: ir.IrOp, ran: Ran, *args: object) -> str:
    ran.clear()
    op(*args)
    return ran[-1] if ran else "native"


def double(x: Tensor) -> Tensor:
    return x * 2


def mul(x: Tensor, s: Tensor) -> Tensor:
    return x * s


def weighted(x: Tensor, w: Tensor | None) -> Tensor:
    return x if w is None else x * w


# -- 1. an impl's exception propagates, the impl runs once ------------------


@pytest.mark.parametrize("error", [KeyError, TypeError])
def test_an_impl_error_propagates_and_the_impl_runs_once(inplace_op: ir.IrOp, error: type) -> None:
    calls = []

    @inplace_op.register_impl("fails", inplace=True)
    def fails(x: Tensor, x_other: Tensor) -> tuple[Tensor, Tensor]:
        calls.append(1)
        x_other.add_(x)  # writes its input, then fails
        if len(calls) > 1:
            raise error("kernel table has no entry")
        return x, x_other

    with inplace_op.set_priority(["fails"]):
        inplace_op.maybe_inplace(torch.ones(4), torch.ones(4))  # fills the cache
        x, r = torch.ones(4), torch.ones(4)
        with pytest.raises(error, match="kernel table") as info:
            inplace_op.maybe_inplace(x, r)
        assert len(calls) == 2  # once per call: never retried
        assert r.tolist() == [2.0] * 4  # the residual add applied once
        assert info.value.__context__ is None  # not raised while handling a lookup error
        with pytest.raises(error):
            inplace_op(torch.ones(4), torch.ones(4))  # the default overload, on a miss
        with pytest.raises(error):
            inplace_op(torch.ones(4), torch.ones(4))  # and on a hit
    assert len(calls) == 4


def test_tracebacks_show_the_generated_source(make_op) -> None:  # type: ignore[no-untyped-def]
    op = make_op(double)

    @op.register_impl("boom")
    def boom(x: Tensor) -> Tensor:
        raise RuntimeError("boom")

    with op.set_priority(["boom"]), pytest.raises(RuntimeError) as info:
        op(torch.ones(2))
    text = "".join(traceback.format_exception(info.value))
    assert "<vllm_ir generated" in text
    assert "return _vllm_ir_fn(x)" in text  # the generated line itself, from linecache


# -- 2./4. every fact a predicate reads is in the key ----------------------


def _same_as_select(op: ir.IrOp, ran: Ran, provider: str, first: tuple, second: tuple) -> None:
    with op.set_priority([provider]):
        assert _ran(op, ran, *first) == provider
        want = op.select(*second).impl.provider
        assert want == "native"
        assert _ran(op, ran, *second) == want
        assert op.selected_impl(*second).provider == want


def test_hidden_size_is_in_the_key(make_op) -> None:  # type: ignore[no-untyped-def]
    op, ran = make_op(double), []
    _recording(op, ran, "vec8", lambda x: x.shape[-1] % 8 == 0)
    _same_as_select(op, ran, "vec8", (torch.ones(4, 64),), (torch.ones(4, 65),))


def test_strides_are_in_the_key(make_op) -> None:  # type: ignore[no-untyped-def]
    op, ran = make_op(double), []
    _recording(op, ran, "rows", lambda x: rows_flatten_free(x))
    sliced = torch.zeros(4, 256)[:, :128]
    transposed = torch.zeros(128, 4).t()
    _same_as_select(op, ran, "rows", (sliced,), (transposed,))


def test_alignment_is_in_the_key(make_op) -> None:  # type: ignore[no-untyped-def]
    op, ran = make_op(double), []
    _recording(op, ran, "aligned16", lambda x: x.data_ptr() % 16 == 0)
    base = torch.zeros(1040)
    start = (-base.data_ptr() % 16) // 4  # the first 16-byte aligned element
    _same_as_select(
        op, ran, "aligned16", (base[start : start + 1024],), (base[start + 1 : start + 1025],)
    )


def test_every_tensors_device_is_in_the_key(make_op) -> None:  # type: ignore[no-untyped-def]
    op, ran = make_op(mul), []
    _recording(op, ran, "same_dev", lambda x, s: s.device == x.device)
    x = torch.empty(8, device="meta")
    _same_as_select(
        op, ran, "same_dev", (x, torch.tensor(2.0, device="meta")), (x, torch.tensor(2.0))
    )


def test_optional_tensor_layout_is_in_the_key(make_op) -> None:  # type: ignore[no-untyped-def]
    op, ran = make_op(weighted), []
    _recording(op, ran, "dense_w", lambda x, w: w is None or w.is_contiguous())
    x = torch.ones(2, 4, 4)
    _same_as_select(op, ran, "dense_w", (x, torch.ones(4, 4)), (x, torch.ones(4, 4).t()))


def test_batch_class_is_in_the_key(make_op) -> None:  # type: ignore[no-untyped-def]
    # is_contiguous() ignores the stride of a size-1 dimension: a 1-row slice
    # of wider rows is contiguous, two such rows are not
    op, ran = make_op(double), []
    _recording(op, ran, "dense", lambda x: x.is_contiguous())
    wide = torch.zeros(4, 8)
    _same_as_select(op, ran, "dense", (wide[:1, :4],), (wide[:2, :4],))


def test_the_triton_style_scale_device_check(make_op) -> None:  # type: ignore[no-untyped-def]
    # the shipped triton FP8 predicates compare the scale's device with x's
    def quant(x: Tensor, scale: Tensor) -> Tensor:
        return x / scale

    op, ran = make_op(quant), []
    _recording(
        op,
        ran,
        "triton_like",
        lambda x, scale: scale.dtype == torch.float32 and scale.device == x.device,
    )
    x = torch.randn(4, 256, device="meta")
    _same_as_select(
        op, ran, "triton_like", (x, torch.tensor(0.5, device="meta")), (x, torch.tensor(0.5))
    )


# -- 3. no selection made under old priorities survives their change -------


def test_a_selection_in_flight_during_apply_is_not_stored(make_op) -> None:  # type: ignore[no-untyped-def]
    op, ran = make_op(double), []
    entered, gate = threading.Event(), threading.Event()
    blocking = [False]

    def slow(x: Tensor) -> bool:
        if blocking[0]:
            entered.set()
            gate.wait(10)
        return True

    _recording(op, ran, "slow", slow)
    _recording(op, ran, "other", None)
    x = torch.ones(2)
    ir.IrOpPriorityConfig(**{op.name: ["slow"]}).apply()
    blocking[0] = True
    thread = threading.Thread(target=op, args=(x,))
    thread.start()
    assert entered.wait(10)  # the thread is selecting under ['slow']
    ir.IrOpPriorityConfig(**{op.name: ["other"]}).apply()
    blocking[0] = False
    gate.set()
    thread.join()
    assert op.select(x).impl.provider == "other"
    assert _ran(op, ran, x) == "other"
    assert op.selected_impl(x).provider == "other"


def test_store_refuses_a_stale_generation() -> None:
    table = cache.register_cache()
    try:
        since = cache.generation()
        ir.invalidate_caches()
        assert not cache.store(table, "k", "stale", since)
        assert cache.store(table, "k", "fresh", cache.generation())
        assert table == {"k": "fresh"}
    finally:
        cache.release_cache(table)


# -- 5. mode, environment, types, growth, tracing ----------------------------


def test_the_fast_path_honours_compiled_selection(make_op) -> None:  # type: ignore[no-untyped-def]
    op, ran = make_op(double), []
    _recording(op, ran, "fast", None)
    platform = ir.provider.current_platform()
    add_platform_defaults(
        "soundness-test",
        [ir.provider.PlatformDefaults(platform, eager={op.name: ["fast"]}, compiled={op.name: []})],
    )
    try:
        x = torch.ones(4, 8)
        assert _ran(op, ran, x) == "fast"
        with ir.priority.compiled_selection():
            assert op.selected_impl(x).provider == "native"
            assert _ran(op, ran, x) == "native"
            with op.set_priority(["fast"]):  # scopes inside keep the mode
                assert _ran(op, ran, x) == "fast"
            assert _ran(op, ran, x) == "native"
        assert _ran(op, ran, x) == "fast"
    finally:
        remove_platform_defaults("soundness-test")


def test_batch_invariant_never_mixes(make_op, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    op, ran = make_op(double), []
    _recording(op, ran, "fast", None)
    f32, f16 = torch.ones(4, 8), torch.ones(4, 8, dtype=torch.float16)
    with op.set_priority(["fast"]):
        assert _ran(op, ran, f32) == "fast"
        monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
        # read once per cache generation: cached and new keys agree with select()
        for x in (f32, f16):
            assert op.select(x).impl.provider == _ran(op, ran, x) == "fast"
        ir.invalidate_caches()
        for x in (f32, f16):
            assert op.select(x).impl.provider == _ran(op, ran, x) == "native"


def test_wrong_argument_types_raise_a_clear_type_error() -> None:
    with pytest.raises(
        TypeError,
        match=r"rms_norm\(\) expected a value of type 'Tensor' for argument 'x' but "
        r"instead found type 'list'",
    ):
        ir.ops.rms_norm([1.0] * 8, None, 1e-6)
    with pytest.raises(TypeError, match="argument 'epsilon' but instead found type 'str'"):
        ir.ops.rms_norm(torch.ones(2, 8), None, "1e-6")
    with pytest.raises(TypeError, match="argument 'weight'"):
        ir.ops.rms_norm.selected_impl(torch.ones(2, 8), 3, 1e-6)


def test_tensor_scalars_go_through_the_torch_op_uncached() -> None:
    op, x = ir.ops.rms_norm, torch.ones(2, 8)
    ir.invalidate_caches()
    refs = []
    for _ in range(50):
        eps = torch.tensor(1e-6)
        refs.append(weakref.ref(eps))
        torch.testing.assert_close(op(x, None, eps), op.torch_op(x, None, eps))
    del eps
    gc.collect()
    assert len(op._calls) == 0
    assert not any(r() is not None for r in refs)


def test_caches_are_bounded_and_nan_is_not_cached() -> None:
    op, x = ir.ops.rms_norm, torch.ones(2, 8)
    ir.invalidate_caches()
    for i in range(cache.MAX_ENTRIES + 50):
        op(x, None, 1e-6 + i * 1e-12)
        op.selected_impl(x, None, 1e-6 + i * 1e-12)
    assert len(op._calls) == cache.MAX_ENTRIES
    assert len(op.selector.cache_of("eager")) == cache.MAX_ENTRIES
    ir.invalidate_caches()
    for _ in range(20):
        op(x, None, float("nan"))
        op.selected_impl(x, None, float("nan"))
    assert len(op._calls) == len(op.selector.cache_of("eager")) == 0


def test_the_key_adds_no_guards_on_symbolic_shapes() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env)
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC])
    real = torch.randn(4, 64)[:, :32]  # kept alive: its fake gets symbolic sizes and strides
    with mode:
        sliced = mode.from_tensor(real, symbolic_context=dynamic)
        assert isinstance(sliced.stride(0), torch.SymInt)
        w = mode.from_tensor(torch.randn(32))
        before = len(env.guards)
        ir.ops.rms_norm.selection_key(sliced, w, 1e-6)
        assert ir.ops.rms_norm.selected_impl(sliced, w, 1e-6).provider in ir.ops.rms_norm.impls
        assert len(env.guards) == before


# -- the debug switch --------------------------------------------------------


def test_the_check_catches_a_predicate_reading_a_fact_outside_the_key(make_op) -> None:  # type: ignore[no-untyped-def]
    op, ran = make_op(double), []
    _recording(op, ran, "offset0", lambda x: x.storage_offset() == 0)
    base = torch.zeros(64)
    with op.set_priority(["offset0"]):
        assert eager.selection_check_enabled()  # the suite runs with it (conftest)
        assert _ran(op, ran, base[0:8]) == "offset0"
        with pytest.raises(eager.SelectionMismatch, match="select\\(\\) chooses"):
            op(base[16:24])  # 64 bytes on: the same key, another storage offset
        eager.set_selection_check(False)
        try:
            assert _ran(op, ran, base[16:24]) == "offset0"  # what the check exists for
        finally:
            eager.set_selection_check(True)


def test_the_check_covers_the_first_call_served_by_the_selection_key(make_op) -> None:  # type: ignore[no-untyped-def]
    """A new batch size of a known class misses the exact cache and hits the selection
    cache: that cached call is re-checked too, as every cached call is."""
    op, ran = make_op(double), []
    _recording(op, ran, "few_rows", lambda x: x.shape[0] < 4)  # reads the batch size
    with op.set_priority(["few_rows"]):
        assert _ran(op, ran, torch.zeros(2, 8)) == "few_rows"
        with pytest.raises(eager.SelectionMismatch, match=r"runs 'few_rows'.*chooses 'native'"):
            op(torch.zeros(8, 8))  # batch class "2 or more" as before, a new exact key
        eager.set_selection_check(False)
        try:
            assert _ran(op, ran, torch.zeros(16, 8)) == "few_rows"  # what the check exists for
        finally:
            eager.set_selection_check(True)
        assert _ran(op, ran, torch.zeros(3, 8)) == "few_rows"  # agreeing: no error
