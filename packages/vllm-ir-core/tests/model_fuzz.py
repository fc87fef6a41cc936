"""Differential fuzzing of model patterns against plain Inductor (not a test module;
run by test_inductor_fuzz.py).

Families (``FAMILIES``), each a generator of random programs compared with eager
under ``VllmIRBackend`` and ``backend="inductor"``:

* ``qkv_rope``: vLLM's attention prologue. One fused projection ``x @ w``; q,
  k and v are views of it (``split`` or slices, in random order and widths);
  RoPE on q and k through ``maybe_inplace`` or the default overload, by
  ``native`` or an in-place kernel; v (and sometimes q's source) read after
  the call. Where q and k are disjoint views the call may donate them.
* ``closures``: an impl that reads a tensor it did not create: a module-level
  table, a closure's tensor, an object's attribute, a dict's entry.

Every value is a small integer or half-integer (``cos``/``sin`` are drawn from
0, ±0.5, ±1), so every op is exact and results are compared bit for bit. Half
the cases compile with dynamic shapes. A case where Inductor is right and
vllm-ir wrong (or raises) is a failure; both wrong counts as upstream.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import vllm_ir as ir
from inductor_fuzz import Stats
from torch import Tensor
from vllm_ir.testing import inductor_caches_off

FAMILIES = ("qkv_rope", "closures")


# ---- RoPE as an op of its own (rotary_embedding's semantics), with an in-place kernel


@ir.register_op(
    name="model_fuzz_rope", activations=["query", "key"], allow_inplace=True, feature_dims=2
)
def fuzz_rope(
    query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool = True
) -> tuple[Tensor, Tensor]:
    """``rotary_embedding`` under a name of its own: the fuzz registers kernels freely."""
    return ir.ops.rotary_embedding.native(query, key, cos, sin, is_neox)


@torch.library.custom_op("vllm_ir_model_fuzz::rope_", mutates_args=("query", "key"))
def _rope_kernel(query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool) -> None:
    q, k = fuzz_rope.native(query, key, cos, sin, is_neox)
    query.copy_(q)
    key.copy_(k)


@fuzz_rope.register_impl("inplace", inplace=True)
def _rope_inplace(
    query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool = True
) -> tuple[Tensor, Tensor]:
    _rope_kernel(query, key, cos, sin, is_neox)
    return query, key


# ---- an op whose impls read tensors they did not create --------------------------


@ir.register_op(name="model_fuzz_shift")
def shift(x: Tensor) -> Tensor:
    return x + torch.arange(x.shape[-1], dtype=x.dtype, device=x.device)


TABLE = torch.arange(64.0)


class _Shifter:
    def __init__(self) -> None:
        self.table = torch.arange(64.0)

    def apply(self, x: Tensor) -> Tensor:
        return x + self.table[: x.shape[-1]]


SHIFTER = _Shifter()
TABLES = {"shift": torch.arange(64.0)}


def _closure_impl() -> Callable[[Tensor], Tensor]:
    table = torch.arange(64.0)

    def impl(x: Tensor) -> Tensor:
        return x + table[: x.shape[-1]]

    return impl


@shift.register_impl("module_table")
def _shift_module_table(x: Tensor) -> Tensor:
    return x + TABLE[: x.shape[-1]]


shift.register_impl("closure")(_closure_impl())


@shift.register_impl("attribute")
def _shift_attribute(x: Tensor) -> Tensor:
    return SHIFTER.apply(x)


@shift.register_impl("dict_entry")
def _shift_dict_entry(x: Tensor) -> Tensor:
    return x + TABLES["shift"][: x.shape[-1]]


SHIFT_IMPLS = ("module_table", "closure", "attribute", "dict_entry")


# ---- cases -----------------------------------------------------------------------


@dataclass
class Case:
    seed: int
    family: str
    describe: str
    fn: Callable[..., Any]
    inputs: list[list[Tensor]]
    """One argument list per call (dynamic cases: several token counts)."""
    priority: dict[str, list[str]]
    dynamic: bool


def _ints(*shape: int, low: int = -3, high: int = 4) -> Tensor:
    return torch.randint(low, high, shape).float()


def _halves(*shape: int) -> Tensor:
    values = torch.tensor([0.0, 0.5, -0.5, 1.0, -1.0])
    return values[torch.randint(0, len(values), shape)]


def _qkv_case(rng: random.Random, seed: int) -> Case:
    heads, kv_heads, size = rng.choice([1, 2, 4]), rng.choice([1, 2]), rng.choice([4, 8])
    rotary = rng.choice([size, size // 2])
    neox = rng.random() < 0.5
    donate = rng.random() < 0.7
    split = rng.random() < 0.5
    order = rng.sample(["q", "k", "v"], 3)  # where each sits in the projection
    widths = {"q": heads * size, "k": kv_heads * size, "v": kv_heads * size}
    start, spans = 0, {}
    for name in order:
        spans[name] = (start, start + widths[name])
        start += widths[name]
    hidden, total = 8, start
    read_source_after = rng.random() < 0.3

    def fn(x: Tensor, w: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, ...]:
        qkv = x @ w
        if split:
            pieces = dict(zip(order, qkv.split([widths[n] for n in order], dim=-1), strict=True))
        else:
            pieces = {n: qkv[:, a:b] for n, (a, b) in spans.items()}
        q = pieces["q"].unflatten(-1, (heads, size))
        k = pieces["k"].unflatten(-1, (kv_heads, size))
        call = fuzz_rope.maybe_inplace if donate else fuzz_rope
        q, k = call(q, k, cos, sin, neox)
        out = (q * 1, k * 1, pieces["v"] * 1)
        if read_source_after and not donate:
            out = (*out, qkv.sum(-1))  # the default overload leaves the projection alone
        return out

    def args(n: int) -> list[Tensor]:
        return [_ints(n, hidden), _ints(hidden, total, low=-1, high=2), _halves(n, rotary),
                _halves(n, rotary)]  # fmt: skip

    dynamic = rng.random() < 0.5
    calls = [args(n) for n in ([3, 5, 9] if dynamic else [5])]
    provider = rng.choice(["native", "inplace"])
    describe = (
        f"heads {heads}/{kv_heads} x {size} (rotary {rotary}, neox {neox}), layout {order} "
        f"({'split' if split else 'slices'}), {'maybe_inplace' if donate else 'default'} "
        f"with {provider}, source read after: {read_source_after}"
    )
    return Case(
        seed, "qkv_rope", describe, fn, calls, {fuzz_rope.name: [provider, "native"]}, dynamic
    )


def _closure_case(rng: random.Random, seed: int) -> Case:
    impl = rng.choice(SHIFT_IMPLS)
    before = rng.choice([" * 2 + 1", "[1:]", ".t().contiguous()"])

    def fn(x: Tensor) -> Tensor:
        if before == "[1:]":
            x = x[1:]
        elif before == ".t().contiguous()":
            x = x.t().contiguous()
        else:
            x = x * 2 + 1
        return shift(x) * 2

    dynamic = rng.random() < 0.5
    calls = [[_ints(n, 8)] for n in ([4, 6, 9] if dynamic else [6])]
    describe = f"x{before} -> shift by {impl}"
    return Case(seed, "closures", describe, fn, calls, {shift.name: [impl, "native"]}, dynamic)


def make_case(seed: int, family: str) -> Case:
    rng = random.Random(seed)
    if family == "qkv_rope":
        return _qkv_case(rng, seed)
    assert family == "closures", family
    return _closure_case(rng, seed)


# ---- checking --------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor):
        return isinstance(b, Tensor) and a.shape == b.shape and torch.equal(a, b)
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))


def check_case(case: Case, stats: Stats) -> None:
    """Compile ``case`` with both backends; call each on every argument list
    (counted in ``stats``, :class:`inductor_fuzz.Stats`)."""
    torch._dynamo.reset()
    dynamic = case.dynamic or None
    ours = torch.compile(case.fn, backend=ir.VllmIRBackend(priority=case.priority), dynamic=dynamic)
    theirs = torch.compile(case.fn, backend="inductor", dynamic=dynamic)
    stats.cases[case.family] += 1
    config = ir.IrOpPriorityConfig(**case.priority)
    for args in case.inputs:
        with config.scope(), torch.no_grad(), inductor_caches_off():
            want = case.fn(*[a.clone() for a in args])
            plain = theirs(*[a.clone() for a in args])
            try:
                got = ours(*[a.clone() for a in args])
            except Exception as e:  # a crash where Inductor runs is a finding
                got, error = None, f"raised {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            else:
                error = "" if _same(got, want) else "differs from eager"
        stats.record(
            case.family,
            not error,
            _same(plain, want),
            f"seed {case.seed} (dynamic={case.dynamic}, {case.priority}): "
            f"{case.describe}: vllm_ir {error}",
        )
        if error:
            return
