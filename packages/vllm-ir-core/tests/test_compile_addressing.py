"""Compiled == eager where memory is addressed absolutely, and never worse than
plain Inductor: programs with and without IR ops that take ``as_strided``
views of copies Inductor's no-op removal drops, of ``split``/``chunk``/
``unbind`` pieces, of dtype views, of row-slice graph inputs; offsets with
floor divisions; the upstream-hazard fallback's view spellings; the lowering's
trace cache across recompiles; ``supports_args`` reading data pointers.

Values are small integers so eager and compiled agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
import vllm_ir as ir
from torch import Tensor
from vllm_ir.selection import NO_DATA_POINTER
from vllm_ir.testing import inductor_caches_off


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled_equals_eager(fn: Callable[..., Tensor], *args: Tensor, **kwargs: object) -> None:
    want = fn(*(a.clone() for a in args))
    with torch.no_grad(), inductor_caches_off():
        got = torch.compile(fn, backend=ir.VllmIRBackend(**kwargs))(*(a.clone() for a in args))  # type: ignore[arg-type]
    torch.testing.assert_close(got, want, atol=0, rtol=0)


# -- copies that Inductor's no-op removal replaces by what they copy ----------

COPIES: dict[str, Callable[[Tensor], Tensor]] = {
    "clone": lambda s: s.clone(),
    "cat": lambda s: torch.cat([s]),
    "repeat": lambda s: s.repeat(1, 1),
    "pad": lambda s: F.pad(s, (0, 0)),
    "to_copy": lambda s: s.to(copy=True),
    "pow1": lambda s: s**1,
    "copy_into_empty": lambda s: torch.empty_like(s).copy_(s),
}


@pytest.mark.parametrize("copy", list(COPIES))
@pytest.mark.parametrize("of", ["intermediate", "input"])
def test_as_strided_of_a_copy_of_a_slice(copy: str, of: str) -> None:
    """A fresh copy's offset 0 is its own first element, not the slice's root's."""

    def fn(a: Tensor) -> Tensor:
        b = a * 2 if of == "intermediate" else a
        c = COPIES[copy](b[1:3])
        return c.as_strided((2, 3), (6, 1), 0) + 0

    compiled_equals_eager(fn, torch.arange(24.0).view(4, 6))


# -- pieces of split / chunk / unbind, and dtype views --------------------------


@ir.register_op(name="addressing_head2")
def head2(x: Tensor) -> Tensor:
    return x[:2] * 2


@head2.register_impl("addressing_strided")
def _head2_strided(x: Tensor) -> Tensor:
    return x.as_strided((2, x.shape[1]), x.stride(), x.storage_offset()) * 2


PIECES: dict[str, Callable[[Tensor], Tensor]] = {
    "chunk": lambda h: h.chunk(2)[1],
    "split": lambda h: h.split(3)[-1],
    "unbind": lambda h: h.unflatten(0, (2, 4)).unbind(0)[1],
    "slice": lambda h: h[4:],
}


@pytest.mark.parametrize("piece", list(PIECES))
def test_offset_reading_impl_on_a_piece_of_an_intermediate(piece: str) -> None:
    def fn(base: Tensor) -> Tensor:
        return head2(PIECES[piece](base * 2))

    with head2.set_priority(["addressing_strided"]):
        compiled_equals_eager(
            fn, torch.arange(24.0).view(8, 3), priority={head2.name: ["addressing_strided"]}
        )


VIEWS: dict[str, Callable[[Tensor], Tensor]] = {
    "unbind_unsqueeze": lambda a: (a * 2).unbind(0)[1].unsqueeze(0),
    "chunk_view": lambda a: (a * 2).chunk(2)[1].view(-1),
    "int32_view_of_a_slice": lambda a: (a * 2)[1:].view(torch.int32)[1:],
    "int16_view_of_an_input_slice": lambda a: a[1:].view(torch.int16)[1:],
}


@pytest.mark.parametrize("view", list(VIEWS))
def test_as_strided_without_offset_of_a_view(view: str) -> None:
    def fn(a: Tensor) -> Tensor:
        return VIEWS[view](a).as_strided((2, 3), (1, 2)) * 1

    compiled_equals_eager(fn, torch.arange(24.0).view(4, 6))


# -- storage offsets the graph computes with a floor division -------------------


@ir.register_op(name="addressing_rows")
def rows_of(x: Tensor) -> Tensor:
    return x * 3


@rows_of.register_impl("addressing_offset_reader")
def _rows_offset_reader(x: Tensor) -> Tensor:
    return x.as_strided(x.size(), x.stride(), x.storage_offset()) * 3


@pytest.mark.parametrize(
    "piece",
    [
        lambda b: b.narrow(0, b.shape[0] // 2, 2),
        lambda b: b.chunk(2)[1],
        lambda b: b.tensor_split(2)[1],
    ],
    ids=["narrow_half", "chunk", "tensor_split"],
)
def test_storage_offset_with_a_floor_division_under_dynamic_shapes(
    piece: Callable[[Tensor], Tensor],
) -> None:
    def fn(base: Tensor) -> Tensor:
        return rows_of(piece(base))

    prio = {rows_of.name: ["addressing_offset_reader"]}
    base = torch.arange(40.0).view(8, 5)
    with rows_of.set_priority(prio[rows_of.name]):
        want = fn(base)
    with torch.no_grad(), inductor_caches_off():
        compiled = torch.compile(fn, backend=ir.VllmIRBackend(priority=prio), dynamic=True)
        got = compiled(base)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


# -- explicit offsets on a row-slice graph input ------------------------------------


def row_slice(rows: int) -> Tensor:
    """``rows`` rows of a fresh base, from its second: a nonzero storage offset."""
    return torch.arange((rows + 2) * 8.0).view(rows + 2, 8)[1 : rows + 1]


INPUT_VIEWS: dict[str, Callable[[Tensor], Tensor]] = {
    "rows_1_2": lambda x: _rows_1_2(x),  # defined with the hazard tests below
    "of_a_slice": lambda x: (s := x[1:3]).as_strided(s.size(), s.stride(), s.storage_offset()),
    "identity": lambda x: x.as_strided(x.size(), x.stride(), x.storage_offset()),
}


@pytest.mark.parametrize("view", list(INPUT_VIEWS))
def test_as_strided_at_an_absolute_offset_on_a_row_slice_input(view: str) -> None:
    """The offset counts from the input's storage; torch 2.11's Inductor counts it
    from the input's first element (plain ``torch.compile`` reads rows further
    on), and the absolute-views pass counts it so there. Dynamic shapes: with
    static ones Dynamo does not trace ``storage_offset()`` (a graph break)."""

    def fn(x: Tensor) -> Tensor:
        return INPUT_VIEWS[view](x) * 2 + 1

    compiled = torch.compile(fn, backend=ir.VllmIRBackend(), dynamic=True)
    with torch.no_grad(), inductor_caches_off():
        for rows in (4, 5):
            got, want = compiled(row_slice(rows)), fn(row_slice(rows))
            torch.testing.assert_close(got, want, atol=0, rtol=0, msg=f"{rows} rows")


@pytest.mark.parametrize("copy", ["none", "clone", "clone_and_input"])
def test_offset_reading_impl_on_a_row_slice_input(copy: str) -> None:
    """Fuzz seed 1085 (torch 2.11): the inlined impl's ``as_strided`` at the
    input's own offset, on the input or (once Inductor or clone elimination
    removed the copy) on a copy of it, read the rows after the slice."""

    def fn(x: Tensor) -> Tensor:
        if copy == "none":
            return head2(x)
        return head2(x.clone()) if copy == "clone" else head2(x.clone()) + x[:2]

    prio = {head2.name: ["addressing_strided"]}
    with head2.set_priority(prio[head2.name]), torch.no_grad(), inductor_caches_off():
        got = torch.compile(fn, backend=ir.VllmIRBackend(priority=prio))(row_slice(4))
        want = fn(row_slice(4))
    torch.testing.assert_close(got, want, atol=0, rtol=0)


# -- the upstream-hazard fallback sees every spelling of a view -------------------


def _rows_1_2(x: Tensor) -> Tensor:
    return x.as_strided((2, x.shape[1]), x.stride(), x.storage_offset() + x.stride(0))


WRITES: dict[str, Callable[[Tensor], object]] = {
    "T": lambda x: x.T.add_(1),
    "mT": lambda x: x.mT.add_(1),
    "swapaxes": lambda x: x.swapaxes(0, 1).add_(1),
    "moveaxis": lambda x: x.moveaxis(0, 1).add_(1),
    "aten_alias": lambda x: torch.ops.aten.alias.default(x).add_(1),
    "aten_view": lambda x: torch.ops.aten.add_.Tensor(torch.ops.aten.view.default(x, [-1]), 1),
    "real": lambda x: x.real.add_(1),
    "data": lambda x: x.data.add_(1),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_hazard_fallback_follows_views_by_storage(write: str) -> None:
    def fn(x: Tensor) -> Tensor:
        v = _rows_1_2(x)
        WRITES[write](x)
        return v * 2

    base = torch.arange(48.0).view(6, 8)
    want = fn(base.clone()[1:5])
    backend = ir.VllmIRBackend()
    with torch.no_grad(), inductor_caches_off():
        got = torch.compile(fn, backend=backend, dynamic=True)(base.clone()[1:5])
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert backend.pass_contexts[0].eager_fallback


# -- the lowering's traces never outlive the compile that made them --------------


@ir.register_op(name="addressing_by_rows")
def by_rows(x: Tensor) -> Tensor:
    return x * 2


@by_rows.register_impl("addressing_decode_prefill")
def _by_rows_branching(x: Tensor) -> Tensor:
    if x.shape[0] <= 8:  # a decode kernel for few rows: guards the trace on it
        return x + x
    return x * 2 + 100  # wrong on purpose, reached only when the branch is taken


def test_trace_cache_across_recompiles() -> None:
    """A trace made under ``rows <= 8`` must not serve the graph recompiled for 12."""
    prio = {by_rows.name: ["addressing_decode_prefill"]}
    backend = ir.VllmIRBackend(priority=prio)
    compiled = torch.compile(lambda x: by_rows(x) + 1, backend=backend, dynamic=True)
    with by_rows.set_priority(prio[by_rows.name]), torch.no_grad(), inductor_caches_off():
        for rows in (4, 12):
            x = torch.arange(rows * 3.0).view(rows, 3)
            torch.testing.assert_close(compiled(x), by_rows(x) + 1, atol=0, rtol=0)
    assert len(backend.pass_contexts) == 2  # the recompile happened


# -- supports_args reading the data pointer ---------------------------------------


@ir.register_op(name="addressing_double")
def double(x: Tensor) -> Tensor:
    return x * 2


@double.register_impl("addressing_aligned", supports_args=lambda x: x.data_ptr() % 16 == 0)
def _double_aligned(x: Tensor) -> Tensor:
    return x + x


def test_a_data_pointer_predicate_declines_when_compiling() -> None:
    prio = {double.name: ["addressing_aligned"]}
    x = torch.arange(32.0)
    with double.set_priority(prio[double.name]):
        assert double.selected_impl(x).provider == "addressing_aligned"
        want = double(x) + 1
        fake_mode = torch._subclasses.FakeTensorMode()
        with fake_mode:  # as compiled selection runs
            decision = double.select(fake_mode.from_tensor(x), mode="compiled").decisions[0]
    assert not decision.accepted
    assert decision.reason == NO_DATA_POINTER
    backend = ir.VllmIRBackend(priority=prio)
    with torch.no_grad(), inductor_caches_off():
        got = torch.compile(lambda t: double(t) + 1, backend=backend)(x)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert backend.lowering_pass.selected_impls[double.name] == {"addressing_double": "native"}


def test_offset_reading_impl_through_views_that_reinterpret_the_dtype() -> None:
    """Fuzz (against Inductor, recompiles, seed 101): a float64 piece viewed as
    int32 and back as float32, at a nonzero offset, read by an inlined impl."""

    def fn(base: Tensor) -> Tensor:
        piece = (base * 3 + 1).split(2)[-1].add_(1)
        return head2(piece.view(torch.int32)[0:].view(torch.float32))

    with head2.set_priority(["addressing_strided"]):
        compiled_equals_eager(
            fn,
            torch.arange(24.0, dtype=torch.float64).view(4, 6),
            priority={head2.name: ["addressing_strided"]},
        )
