"""The absolute-views pass on traced graphs: exact rewrites, checked by running them.

End to end (through Inductor, where the rewrites matter) in
test_compile_soundness.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor, fx
from torch._subclasses import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from vllm_ir.compilation._absolute_views import (
    count_input_offsets_from_the_input,
    rebase_absolute_views,
    resolve_storage_offsets,
)

as_strided = torch.ops.aten.as_strided.default


def as_strided_sources(gm: fx.GraphModule) -> list[str]:
    return [str(n.args[0]) for n in gm.graph.find_nodes(op="call_function", target=as_strided)]


def check_same(fn: Callable[..., Tensor], gm: fx.GraphModule, *args: Tensor) -> None:
    gm.recompile()
    torch.testing.assert_close(gm(*args), fn(*args), atol=0, rtol=0)


def test_as_strided_of_a_view_chain_is_taken_from_its_root() -> None:
    def fn(a: Tensor) -> Tensor:
        rows = (a + 1)[1:3].t().t()  # three views deep
        return rows.as_strided((2, 2), (1, 3), 4)

    gm = make_fx(fn)(torch.zeros(4, 3))
    assert rebase_absolute_views(gm.graph) == 1
    assert as_strided_sources(gm) == ["add"]
    check_same(fn, gm, torch.arange(12.0).view(4, 3))


def test_a_missing_offset_is_the_views_own() -> None:
    def fn(a: Tensor) -> Tensor:
        return as_strided((a * 2)[1:3], (2, 3), (3, 1))

    # fake mode: its FakeTensors keep views' storage offsets, as Inductor's do
    gm = make_fx(fn, tracing_mode="fake")(torch.zeros(4, 3))
    assert rebase_absolute_views(gm.graph) == 1
    (node,) = gm.graph.find_nodes(op="call_function", target=as_strided)
    assert node.args[3] == 3
    check_same(fn, gm, torch.arange(12.0).view(4, 3))


def test_views_that_reinterpret_the_dtype_are_not_crossed() -> None:
    def fn(a: Tensor) -> Tensor:
        words = (a + 1).view(torch.int32)  # offsets count int32 elements from here
        return words[1:3].as_strided((2, 3), (3, 1), 3)

    gm = make_fx(fn)(torch.zeros(4, 3))
    assert rebase_absolute_views(gm.graph) == 1
    assert as_strided_sources(gm) == ["view"]
    check_same(fn, gm, torch.arange(12.0).view(4, 3))


def test_as_strided_of_a_root_is_left_alone() -> None:
    gm = make_fx(lambda a: (a + 1).as_strided((2, 3), (3, 1), 3))(torch.zeros(4, 3))
    assert rebase_absolute_views(gm.graph) == 0


@pytest.mark.parametrize("first", [1, 2])
def test_symbolic_storage_offsets_become_sizes_of_the_inputs(first: int) -> None:
    def fn(a: Tensor) -> Tensor:
        rows = a[first:]
        return rows.as_strided(rows.size(), rows.stride(), rows.storage_offset())

    gm = make_fx(fn, tracing_mode="symbolic")(torch.zeros(5, 3))
    assert gm.graph.find_nodes(op="call_function", target=torch.ops.aten.sym_storage_offset.default)
    assert resolve_storage_offsets(gm.graph) == 1
    assert not gm.graph.find_nodes(
        op="call_function", target=torch.ops.aten.sym_storage_offset.default
    )
    check_same(fn, gm, torch.arange(24.0).view(6, 4))


def test_an_offset_it_cannot_express_is_an_error() -> None:
    def fn(a: Tensor) -> Tensor:
        rows = a[1:]
        return rows.as_strided(rows.size(), rows.stride(), rows.storage_offset())

    gm = make_fx(fn, tracing_mode="symbolic")(torch.zeros(5, 3))
    (node,) = gm.graph.find_nodes(
        op="call_function", target=torch.ops.aten.sym_storage_offset.default
    )
    # make the view's offset a symbol no graph input carries
    env = ShapeEnv()
    with FakeTensorMode(shape_env=env):
        stranger = env.create_unbacked_symint()
        node.args[0].meta["val"] = torch.empty(16).as_strided((2, 3), (3, 1), stranger)
    with pytest.raises(RuntimeError, match="would read 0"):
        resolve_storage_offsets(gm.graph)


def _as_strided_at(offset: int) -> fx.GraphModule:
    """``as_strided`` at ``offset`` of a graph input whose storage offset is 3."""
    gm = make_fx(lambda x: as_strided(x, (2, 3), (3, 1), offset), tracing_mode="fake")(
        torch.zeros(6, 3)[1:5]
    )
    (placeholder,) = gm.graph.find_nodes(op="placeholder")
    assert placeholder.meta["val"].storage_offset() == 3
    return gm


def test_input_offsets_counted_from_the_input() -> None:
    """For torch 2.11's Inductor (``_inductor_compat``), which reads them so: the
    rewritten graph no longer means what eager means, so only its offsets are checked."""
    gm = _as_strided_at(6)
    assert count_input_offsets_from_the_input(gm.graph) == 1
    (node,) = gm.graph.find_nodes(op="call_function", target=as_strided)
    assert node.args[3] == 3
    with pytest.raises(RuntimeError, match="before the input's first element"):
        count_input_offsets_from_the_input(_as_strided_at(0).graph)
