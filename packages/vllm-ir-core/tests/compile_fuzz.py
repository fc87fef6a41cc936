"""End-to-end differential fuzzing of the compile pipeline (not a test module).

Random programs over IR ops with opaque ``torch.library`` kernels are run in
eager mode and compiled with ``VllmIRBackend``; every output, every input the
program did not donate (its whole base tensor, for inputs passed as row slices
of a bigger one), module buffers and gradients must equal eager's, bit for bit
(all values are small integers, so every op here is exact).

A program is a list of steps over a pool of values, generated with a model of
which values share memory, so it honours the ``maybe_inplace`` contract: a
donated value and everything aliasing it is never read again. The shapes of
program the generator favours are those the compile pipeline has got wrong
before: copies of a graph input or buffer that are then donated (``clone``,
``cat([x])``, ``repeat(1, 1)``, a zero ``pad``, ``empty_like().copy_()``,
``to(copy=True)``, a copy made by a functional impl), values read from a tensor
before an in-place call and used after it (also with the default overload on an
``mm`` output, and input mutation like ``acc[1:3] += x`` before a donation),
row slices of bigger tensors and ``as_strided`` with absolute storage offsets,
grad mode with ``requires_grad`` mixes, functional impls that mutate a copy
internally, in-place impls that leave an activation unwritten and return it,
impls creating tensor constants, graph breaks and dynamic shapes.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
import vllm_ir as ir
from torch import Tensor
from vllm_ir.testing import inductor_caches_off

COLS = 8
ROWS = (4, 6)  # static programs use the first; dynamic ones are called with both


# ---- ops and impls --------------------------------------------------------------


@torch.library.custom_op("vllm_ir_fuzz::scale_add_", mutates_args=("x",))
def _scale_add_kernel(x: Tensor, y: Tensor) -> None:
    x.mul_(2).add_(y)


@torch.library.custom_op("vllm_ir_fuzz::acc_", mutates_args=("x_acc",))
def _acc_kernel(x: Tensor, x_acc: Tensor) -> None:
    x_acc.add_(x)


@ir.register_op(name="fuzz_scale_add", allow_inplace=True)
def scale_add(x: Tensor, y: Tensor) -> Tensor:
    return x * 2 + y


@scale_add.register_impl("fuzz_inplace", inplace=True)
def _scale_add_inplace(x: Tensor, y: Tensor) -> Tensor:
    torch.ops.vllm_ir_fuzz.scale_add_(x, y)
    return x


@scale_add.register_impl("fuzz_strided", inplace=True)
def _scale_add_strided(x: Tensor, y: Tensor) -> Tensor:
    # writes through a view taken with an absolute storage offset
    torch.ops.vllm_ir_fuzz.scale_add_(x.as_strided(x.size(), x.stride(), x.storage_offset()), y)
    return x


@scale_add.register_impl("fuzz_inplace_const", inplace=True)
def _scale_add_inplace_const(x: Tensor, y: Tensor) -> Tensor:
    torch.ops.vllm_ir_fuzz.scale_add_(x, y * torch.tensor([1.0]))
    return x


@scale_add.register_impl("fuzz_copy_then_inplace")
def _scale_add_copy_then_inplace(x: Tensor, y: Tensor) -> Tensor:
    out = x.clone()
    out.mul_(2).add_(y)
    return out


@scale_add.register_impl("fuzz_const")
def _scale_add_const(x: Tensor, y: Tensor) -> Tensor:
    return x * torch.tensor([2.0]) + y


@scale_add.register_impl("fuzz_offset_read")
def _scale_add_offset_read(x: Tensor, y: Tensor) -> Tensor:
    return x.as_strided(x.size(), x.stride(), x.storage_offset()) * 2 + y


@ir.register_op(name="fuzz_acc", allow_inplace=True)
def acc(x: Tensor, x_acc: Tensor) -> tuple[Tensor, Tensor]:
    return x * 1, x_acc + x


@acc.register_impl("fuzz_inplace", inplace=True)
def _acc_inplace(x: Tensor, x_acc: Tensor) -> tuple[Tensor, Tensor]:
    torch.ops.vllm_ir_fuzz.acc_(x, x_acc)  # x is returned unwritten
    return x, x_acc


@ir.register_op(name="fuzz_copy")
def copy(x: Tensor) -> Tensor:
    return x * 1


@copy.register_impl("fuzz_clone")
def _copy_clone(x: Tensor) -> Tensor:
    return x.clone()


SCALE_ADD_IMPLS = [
    "fuzz_inplace",
    "fuzz_strided",
    "fuzz_inplace_const",
    "fuzz_copy_then_inplace",
    "fuzz_const",
    "fuzz_offset_read",
    "native",
]
ACC_IMPLS = ["fuzz_inplace", "native"]
COPY_IMPLS = ["fuzz_clone", "native"]
OPS = {"fuzz_scale_add": scale_add, "fuzz_acc": acc, "fuzz_copy": copy}

COPIES = ("clone", "cat", "repeat", "pad", "empty_like_copy", "to_copy", "ir_copy")


def _copy(kind: str, t: Tensor) -> Tensor:
    if kind == "clone":
        return t.clone()
    if kind == "cat":
        return torch.cat([t])
    if kind == "repeat":
        return t.repeat(1, 1)
    if kind == "pad":
        return F.pad(t, (0, 0))
    if kind == "empty_like_copy":
        return torch.empty_like(t).copy_(t)
    if kind == "to_copy":
        return t.to(t.dtype, copy=True)
    return copy(t)


W = torch.eye(COLS) * 2 + torch.roll(torch.eye(COLS), 1, 0)


# ---- programs -------------------------------------------------------------------


@dataclass
class Value:
    group: int  # values of one group share memory
    inputs: frozenset[int]  # inputs whose memory the value may live in
    rows: str  # "R" (all rows) or "2"
    grad: bool = False


@dataclass
class Fragment:
    """One random program over its own inputs, run by a compiled function."""

    inputs: list[dict[str, Any]]  # per input: donatable, offset (row slice), grad, buffer
    steps: list[tuple[Any, ...]]
    outputs: list[int]
    donated: set[int] = field(default_factory=set)  # inputs the program may have written


def generate(rng: random.Random, *, grad: bool, allow_break: bool) -> Fragment:
    n_inputs = rng.randint(1, 3)
    inputs = []
    for i in range(n_inputs):
        spec = {
            "donatable": rng.random() < 0.5,
            "offset": rng.random() < 0.3,
            "grad": grad and rng.random() < 0.5,
            "buffer": not grad and i > 0 and rng.random() < 0.2,
        }
        if spec["buffer"]:
            spec["donatable"] = spec["offset"] = False
        inputs.append(spec)
    values = [Value(i, frozenset({i}), "R", spec["grad"]) for i, spec in enumerate(inputs)]
    dead: set[int] = set()
    next_group = [n_inputs]
    steps: list[tuple[Any, ...]] = []
    donated: set[int] = set()

    def new(rows: str, grad_: bool, inputs_: frozenset[int] = frozenset()) -> None:
        values.append(Value(next_group[0], inputs_, rows, grad_))
        next_group[0] += 1

    def live(rows: str | None = None) -> list[int]:
        return [
            i
            for i, v in enumerate(values)
            if v.group not in dead and (rows is None or v.rows == rows)
        ]

    def pick(rows: str | None = None) -> int:
        cands = live(rows)
        # favour recent values, so copies get donated soon after they are made
        return cands[-1] if rng.random() < 0.4 else rng.choice(cands)

    def can_write(i: int) -> bool:
        v = values[i]
        return not any(
            inputs[k]["buffer"] or not inputs[k]["donatable"] or inputs[k]["grad"] for k in v.inputs
        ) and not (grad and v.grad)

    for _ in range(rng.randint(2, 9)):
        kind = rng.choices(
            ["copy", "view", "read", "mm", "ir", "donate", "acc", "mutate", "break"],
            weights=[4, 2, 2, 1, 2, 5, 2, 1, 1 if allow_break else 0],
        )[0]
        t = pick()
        v = values[t]
        if kind == "copy":
            steps.append(("copy", rng.choice(COPIES), t))
            new(v.rows, v.grad)
        elif kind == "view":
            if v.rows == "R":
                how = rng.choice(["rows", "as_strided_abs"])
                steps.append(("view", how, t))
            else:
                steps.append(("view", "identity_as_strided", t))
            values.append(Value(v.group, v.inputs, "2", v.grad))
        elif kind == "read":
            steps.append(("read", rng.choice(["pointwise", "rowsum"]), t))
            new(v.rows, v.grad)
        elif kind == "mm":
            steps.append(("mm", t))
            new(v.rows, v.grad)
        elif kind in ("ir", "donate"):
            ys = [y for y in live(v.rows) if values[y].group != v.group]
            y = rng.choice(ys) if ys and rng.random() < 0.7 else None
            y_grad = values[y].grad if y is not None else False
            if kind == "donate" and can_write(t):
                steps.append(("donate", t, y))
                declined = grad and (v.grad or y_grad)
                if not declined:
                    donated |= v.inputs
                dead.add(v.group)
                new(v.rows, v.grad or y_grad, v.inputs)
            else:
                steps.append(("ir", t, y))
                new(v.rows, v.grad or y_grad)
        elif kind == "acc":
            others = [a for a in live(v.rows) if values[a].group != v.group]
            if not others:
                continue
            a = rng.choice(others)
            va = values[a]
            inplace = can_write(t) and can_write(a) and rng.random() < 0.6
            steps.append(("acc", t, a, inplace))
            g = v.grad or va.grad
            if inplace:
                if not (grad and g):
                    donated |= v.inputs | va.inputs
                dead.update((v.group, va.group))
                new(v.rows, g, v.inputs)
                new(v.rows, g, va.inputs)
            else:
                new(v.rows, g)
                new(v.rows, g)
        elif kind == "mutate":
            # ATen in-place on a live value (an input too: AOTAutograd copies it back)
            if grad or any(inputs[k]["buffer"] for k in v.inputs):
                continue
            src = rng.choice([s for s in live("2") if values[s].group != v.group] or [None])
            if v.rows == "R" and src is not None:
                steps.append(("mutate_rows", t, src))
            else:
                steps.append(("mutate", t))
        else:
            steps.append(("break",))
    tail = live()
    outputs = sorted({*rng.sample(tail, k=min(len(tail), rng.randint(1, 3))), tail[-1]})
    return Fragment(inputs, steps, outputs, donated)


def run_fragment(frag: Fragment, args: list[Tensor]) -> list[Tensor]:
    values = list(args)
    for step in frag.steps:
        kind = step[0]
        if kind == "copy":
            values.append(_copy(step[1], values[step[2]]))
        elif kind == "view":
            t = values[step[2]]
            if step[1] == "rows":
                values.append(t[1:3])
            elif step[1] == "as_strided_abs":
                values.append(
                    t.as_strided((2, t.shape[1]), t.stride(), t.storage_offset() + t.stride(0))
                )
            else:
                values.append(t.as_strided(t.size(), t.stride(), t.storage_offset()))
        elif kind == "read":
            t = values[step[2]]
            values.append(t * 2 + 1 if step[1] == "pointwise" else t - t.sum(-1, keepdim=True))
        elif kind == "mm":
            values.append(values[step[1]] @ W)
        elif kind in ("ir", "donate"):
            x = values[step[1]]
            y = values[step[2]] if step[2] is not None else torch.ones_like(x)
            values.append(scale_add(x, y) if kind == "ir" else scale_add.maybe_inplace(x, y))
        elif kind == "acc":
            x, a = values[step[1]], values[step[2]]
            values.extend(acc.maybe_inplace(x, a) if step[3] else acc(x, a))
        elif kind == "mutate_rows":
            values[step[1]][1:3] += values[step[2]]
        elif kind == "mutate":
            values[step[1]].add_(1)
        else:
            torch._dynamo.graph_break()
    return [values[i] for i in frag.outputs]


class Program(torch.nn.Module):
    """Several fragments in one compiled function; buffers hold the buffer inputs."""

    def __init__(self, fragments: list[Fragment], buffers: dict[str, Tensor]) -> None:
        super().__init__()
        self.fragments = fragments
        for name, b in buffers.items():
            self.register_buffer(name, b.clone())

    def forward(self, *flat: Tensor) -> list[Tensor]:
        it = iter(flat)
        outs: list[Tensor] = []
        for f, frag in enumerate(self.fragments):
            args = [
                getattr(self, f"buf{f}_{i}") if spec["buffer"] else next(it)
                for i, spec in enumerate(frag.inputs)
            ]
            outs.extend(run_fragment(frag, args))
        return outs


def _ints(rows: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, (rows, COLS), generator=g).float()


@dataclass
class Case:
    seed: int
    fragments: list[Fragment]
    priority: dict[str, list[str]]
    grad: bool
    dynamic: bool
    calls: int

    def describe(self) -> str:
        lines = [
            f"seed {self.seed}: grad={self.grad} dynamic={self.dynamic} calls={self.calls}",
            f"priority {self.priority}",
        ]
        for f, frag in enumerate(self.fragments):
            lines.append(f"fragment {f}: inputs {frag.inputs}")
            lines += [f"  {s}" for s in frag.steps]
            lines.append(f"  return {frag.outputs}; donated inputs {sorted(frag.donated)}")
        return "\n".join(lines)


def make_case(seed: int) -> Case:
    rng = random.Random(seed)
    grad = rng.random() < 0.2
    dynamic = rng.random() < 0.2
    allow_break = rng.random() < 0.2
    priority = {
        "fuzz_scale_add": [rng.choice(SCALE_ADD_IMPLS)],
        "fuzz_acc": [rng.choice(ACC_IMPLS)],
        "fuzz_copy": [rng.choice(COPY_IMPLS)],
    }
    frags = [generate(rng, grad=grad, allow_break=allow_break) for _ in range(rng.randint(1, 3))]
    has_buffer = any(s["buffer"] for fr in frags for s in fr.inputs)
    calls = 2 if dynamic or has_buffer else 1
    return Case(seed, frags, priority, grad, dynamic, calls)


@dataclass
class Inputs:
    bases: list[Tensor]
    args: list[Tensor]
    grad_leaves: list[Tensor]


def _inputs(case: Case, call: int, rows: int) -> tuple[Inputs, dict[str, Tensor]]:
    bases, args, leaves = [], [], []
    buffers: dict[str, Tensor] = {}
    for f, frag in enumerate(case.fragments):
        for i, spec in enumerate(frag.inputs):
            seed = case.seed * 1000 + call * 100 + f * 10 + i
            if spec["buffer"]:
                buffers[f"buf{f}_{i}"] = _ints(rows, seed)
                continue
            if spec["offset"] and not spec["grad"]:  # leaves autograd owns are whole
                base = _ints(rows + 2, seed)
                arg = base[1 : rows + 1]
            else:
                base = _ints(rows, seed)
                arg = base
            if spec["grad"]:
                base.requires_grad_(True)
                leaves.append(base)
            bases.append(base)
            args.append(arg)
    return Inputs(bases, args, leaves), buffers


def _fresh(inp: Inputs) -> Inputs:
    bases = [b.detach().clone().requires_grad_(b.requires_grad) for b in inp.bases]
    args = []
    for base, arg in zip(bases, inp.args, strict=True):
        if arg.requires_grad or arg.shape == base.shape:
            args.append(base)
        else:
            args.append(base[1 : arg.shape[0] + 1])
    return Inputs(bases, args, [b for b in bases if b.requires_grad])


def _donated_bases(case: Case) -> list[tuple[bool, bool]]:
    """Per base tensor: (donated, passed as a row slice)."""
    flags = []
    for frag in case.fragments:
        for i, spec in enumerate(frag.inputs):
            if not spec["buffer"]:
                flags.append((i in frag.donated, spec["offset"] and not spec["grad"]))
    return flags


def _execute(fn: Callable[..., list[Tensor]], inp: Inputs, grad: bool) -> dict[str, Any]:
    result: dict[str, Any] = {}
    with torch.set_grad_enabled(grad):
        try:
            outs = fn(*inp.args)
        except Exception as e:
            return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    result["outputs"] = [o.detach().clone() for o in outs]
    if grad and inp.grad_leaves:
        loss = sum((o * (k + 1)).sum() for k, o in enumerate(outs) if o.requires_grad)
        if isinstance(loss, Tensor):
            try:
                result["grads"] = torch.autograd.grad(loss, inp.grad_leaves, allow_unused=True)
            except Exception as e:
                result["grads"] = f"backward raises {type(e).__name__}"
    result["bases"] = [b.detach().clone() for b in inp.bases]
    return result


@dataclass
class Stats:
    compiles: int = 0
    programs: int = 0
    clones_inserted: int = 0
    clones_removed: int = 0
    kept: Counter[str] = field(default_factory=Counter)
    miscompiles: list[str] = field(default_factory=list)
    eager_errors: int = 0  # programs eager rejects (a generator bug if not 0)
    eager_fallbacks: int = 0  # graphs the backend ran eagerly (upstream_hazards)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return a.shape == b.shape and torch.equal(a, b)
    if a is None or b is None:  # an unused input's gradient: None, or zeros
        other = a if a is not None else b
        return other is None or not bool(other.any())
    return bool(a == b)


def reason_kind(reason: str) -> str:
    """A clone-kept reason without the node names in it, for counting."""
    reason = reason.split(":")[0]
    reason = re.sub(r"^\S+ reads the source", "a value reads the source", reason)
    reason = re.sub(r"used by \S+ after", "used after", reason)
    return re.sub(r"graph input \S+, which", "a graph input, which", reason)


def check_case(case: Case, stats: Stats) -> list[str]:
    """Compile ``case`` once, run it ``case.calls`` times against eager; the differences."""
    torch._dynamo.reset()
    buffers = _inputs(case, 0, ROWS[0])[1]
    eager_model = Program(case.fragments, buffers)
    comp_model = Program(case.fragments, buffers)
    backend = ir.VllmIRBackend(priority=case.priority)
    compiled = torch.compile(comp_model, backend=backend, dynamic=case.dynamic or None)
    problems: list[str] = []
    donated = _donated_bases(case)
    with (
        scale_add.set_priority(case.priority["fuzz_scale_add"]),
        acc.set_priority(case.priority["fuzz_acc"]),
        copy.set_priority(case.priority["fuzz_copy"]),
    ):
        for call in range(case.calls):
            # dynamic programs get other row counts (buffers keep theirs)
            resize = case.dynamic and not buffers
            rows = ROWS[call % len(ROWS)] if resize else ROWS[0]
            inp = _inputs(case, call + 1, rows)[0]
            want = _execute(eager_model, _fresh(inp), case.grad)
            with inductor_caches_off():
                got = _execute(compiled, _fresh(inp), case.grad)
            stats.eager_errors += "error" in want
            problems += _compare(want, got, donated, call)
            for name, b in eager_model.named_buffers():
                if not torch.equal(b, comp_model.get_buffer(name)):
                    problems.append(f"call {call}: buffer {name} differs")
    stats.compiles += 1
    stats.programs += len(case.fragments)
    for ctx in backend.pass_contexts:
        stats.eager_fallbacks += ctx.eager_fallback is not None
        stats.clones_inserted += ctx.clones_inserted
        stats.clones_removed += ctx.clones_removed
        stats.kept.update(reason_kind(r) for r in ctx.clones_kept.values())
    if problems:
        stats.miscompiles.append(case.describe() + "\n" + "\n".join(problems))
    return problems


def _compare(
    want: dict[str, Any], got: dict[str, Any], donated: list[tuple[bool, bool]], call: int
) -> list[str]:
    if "error" in want or "error" in got:
        if "error" in want and "error" in got:
            return []
        return [
            f"call {call}: eager {want.get('error', 'ran')}; compiled {got.get('error', 'ran')}"
        ]
    problems = []
    for k, (w, g) in enumerate(zip(want["outputs"], got["outputs"], strict=True)):
        if not _same(w, g):
            problems.append(
                f"call {call}: output {k} differs: eager {w.tolist()} compiled {g.tolist()}"
            )
    for k, (w, g) in enumerate(zip(want["bases"], got["bases"], strict=True)):
        was_donated, sliced = donated[k]
        if was_donated:
            # the rows the program was handed may change, the rest of the base not
            if sliced:
                w, g = w[[0, -1]], g[[0, -1]]
            else:
                continue
        if not torch.equal(w, g):
            problems.append(
                f"call {call}: input {k} (not donated) differs: "
                f"eager {w.tolist()} compiled {g.tolist()}"
            )
    wg, gg = want.get("grads"), got.get("grads")
    if isinstance(wg, str) or isinstance(gg, str):
        if not (isinstance(wg, str) and isinstance(gg, str)):
            problems.append(
                f"call {call}: backward eager {wg if isinstance(wg, str) else 'ok'}, "
                f"compiled {gg if isinstance(gg, str) else 'ok'}"
            )
    elif wg is not None:
        for k, (w, g) in enumerate(zip(wg, gg or [], strict=False)):
            if not _same(w, g):
                problems.append(f"call {call}: gradient {k} differs")
    return problems


# ---- bucketed tables under awkward symbolic sizes --------------------------------
#
# A second family: programs over ops whose priority is a random bucketed table, called
# on activations whose token count or layout is an expression plain Inductor accepts
# but a torch.cond branch may not carry: unbacked (``x[:k]``, ``k = cnt.item()``), a
# product (batch x sequence), a floor division (``hidden // heads`` head size), and
# non-contiguous layouts (column-major, every other row, interleaved rows donated
# together). Every impl tags its output (``+ K``), so compiled == eager bit for bit
# says that each call ran its bucket's impl.


@ir.register_op(name="fuzz_bucket_scale", allow_inplace=True)
def bucket_scale(x: Tensor, factor: float) -> Tensor:
    return x * factor


@bucket_scale.register_impl("fuzz_t1")
def _bucket_t1(x: Tensor, factor: float) -> Tensor:
    return x * factor + 1


@bucket_scale.register_impl("fuzz_strided")
def _bucket_strided(x: Tensor, factor: float) -> Tensor:
    # re-views its input at an absolute storage offset, as a kernel given a pointer does
    return x.as_strided(x.size(), x.stride(), x.storage_offset()) * factor + 2


@bucket_scale.register_impl("fuzz_branchy")
def _bucket_branchy(x: Tensor, factor: float) -> Tensor:
    # branches on the token count inside its bucket (a guard when traced)
    return x * factor + (3 if x.shape[0] <= 8 else 5)


@bucket_scale.register_impl("fuzz_inplace", inplace=True)
def _bucket_inplace(x: Tensor, factor: float) -> Tensor:
    return x.mul_(factor).add_(4)


@ir.register_op(name="fuzz_bucket_pair", allow_inplace=True)
def bucket_pair(x: Tensor, x_other: Tensor) -> tuple[Tensor, Tensor]:
    """``(x * 2, x + x_other)``: the sum's size is the broadcast of both (a residual add)."""
    return x * 2, x + x_other


@bucket_pair.register_impl("fuzz_t1")
def _pair_t1(x: Tensor, x_other: Tensor) -> tuple[Tensor, Tensor]:
    return x * 2 + 1, x + x_other


@bucket_pair.register_impl("fuzz_inplace", inplace=True)
def _pair_inplace(x: Tensor, x_other: Tensor) -> tuple[Tensor, Tensor]:
    # returns its activations, whose sizes may be other expressions of equal values
    # than native's broadcast: ceil and floor halves of one buffer, or a head size
    x_other.add_(x).add_(4)
    return x.mul_(2), x_other


@ir.register_op(name="fuzz_bucket_heads", feature_dims=2)
def bucket_heads(x: Tensor, factor: float) -> Tensor:
    """Tokens are the dims before (heads, head size), as for rotary_embedding."""
    return x * factor


@bucket_heads.register_impl("fuzz_t1")
def _heads_t1(x: Tensor, factor: float) -> Tensor:
    return x * factor + 1


@bucket_heads.register_impl("fuzz_strided")
def _heads_strided(x: Tensor, factor: float) -> Tensor:
    return x.as_strided(x.size(), x.stride(), x.storage_offset()) * factor + 2


BUCKET_IMPLS = {
    "fuzz_bucket_scale": ["native", "fuzz_t1", "fuzz_strided", "fuzz_branchy", "fuzz_inplace"],
    "fuzz_bucket_pair": ["native", "fuzz_t1", "fuzz_inplace"],
    "fuzz_bucket_heads": ["native", "fuzz_t1", "fuzz_strided"],
}
BUCKET_OPS = {"fuzz_bucket_scale": bucket_scale, "fuzz_bucket_pair": bucket_pair,
              "fuzz_bucket_heads": bucket_heads}  # fmt: skip
SIZE_FORMS = ("unbacked", "product", "floordiv", "colmajor", "every_other", "interleaved")
HEADS = 2


@dataclass
class BucketCase:
    """One random program of one size form, its tables and its dispatch mode."""

    seed: int
    form: str
    steps: list[tuple[str, float]]  # (op, factor) applied in order
    tables: dict[str, list[dict[str, Any]]]
    dispatch: str
    sizes: tuple[int, ...]  # token counts it is called with (the first compiles)

    def describe(self) -> str:
        return (
            f"seed {self.seed}: form {self.form}, dispatch {self.dispatch}, "
            f"steps {self.steps}, tables {self.tables}, sizes {self.sizes}"
        )


def _random_table(rng: random.Random, impls: list[str]) -> list[dict[str, Any]]:
    bounds = sorted(rng.sample([1, 2, 4, 8, 9, 16, 64], rng.randint(1, 3)))
    picks = [rng.choice(impls) for _ in range(len(bounds) + 1)]
    if len(set(picks)) == 1:  # at least two impls: a branch or a graph per range
        picks[-1] = next(p for p in impls if p != picks[0])
    table: list[dict[str, Any]] = [
        {"max_tokens": b, "priority": [p]} for b, p in zip(bounds, picks, strict=False)
    ]
    table.append({"priority": [picks[-1]]})
    return table


def make_bucket_case(seed: int) -> BucketCase:
    rng = random.Random(seed)
    form = SIZE_FORMS[seed % len(SIZE_FORMS)]  # every form in any run of six seeds
    if form == "floordiv":
        names = ["fuzz_bucket_heads", "fuzz_bucket_pair"]
    elif form == "interleaved":
        names = ["fuzz_bucket_pair"]
    else:
        names = ["fuzz_bucket_scale"]
    steps = [(rng.choice(names), rng.choice([0.5, 2.0, 3.0])) for _ in range(rng.randint(1, 2))]
    used = {name for name, _ in steps}
    tables = {name: _random_table(rng, BUCKET_IMPLS[name]) for name in sorted(used)}
    dispatch = rng.choice(["graphs", "branches"])
    sizes = (rng.choice([5, 8, 17]), rng.choice([3, 12, 40]), rng.choice([2, 9, 64]))
    return BucketCase(seed, form, steps, tables, dispatch, sizes)


def _bucket_inputs(case: BucketCase, rows: int) -> tuple[Tensor, ...]:
    gen = torch.Generator().manual_seed(rows)

    def ints(*shape: int) -> Tensor:
        return torch.randint(-3, 4, shape, generator=gen).float()

    if case.form == "unbacked":
        return ints(rows + 3, COLS), torch.tensor(rows)
    if case.form == "product":
        return (ints(2, rows, COLS),)
    if case.form == "floordiv":
        return ints(rows, HEADS * COLS), torch.zeros(HEADS), ints(rows, HEADS, COLS)
    if case.form == "colmajor":
        return (ints(COLS, rows).t(),)
    if case.form == "every_other":
        return (ints(2 * rows, COLS),)
    return (ints(2 * rows, COLS),)  # interleaved: ceil and floor halves of its rows


def bucket_program(case: BucketCase) -> Callable[..., tuple[Tensor, ...]]:
    """The case's program: the size form's activation, then its steps."""

    def scale_steps(x: Tensor, other: Tensor | None = None) -> Tensor:
        for i, (name, factor) in enumerate(case.steps):
            if name == "fuzz_bucket_pair":
                assert other is not None
                # donated: both are values no later step reads
                x, other = bucket_pair.maybe_inplace(x * factor, other + 0)
            else:
                op = BUCKET_OPS[name]
                # donate an intermediate now and then: maybe_inplace of a value read no more
                donate = i > 0 and name == "fuzz_bucket_scale"
                x = (op.maybe_inplace if donate else op)(x, factor)  # type: ignore[operator]
            x = x.relu() + 1
        return x if other is None else x + other

    def fn(*args: Tensor) -> tuple[Tensor, ...]:
        if case.form == "unbacked":
            x, cnt = args
            k = int(cnt.item())
            torch._check(k >= 0)
            torch._check(k <= x.shape[0])
            return (scale_steps(x[:k]) * 1,)
        if case.form == "floordiv":
            x, h, other = args
            heads = h.shape[0]  # head size: hidden // heads of two dynamic sizes
            return (scale_steps(x.view(x.shape[0], heads, x.shape[1] // heads), other) * 1,)
        if case.form == "every_other":
            return (scale_steps(args[0][::2]) * 1,)
        if case.form == "interleaved":
            buf = args[0].clone()  # donated below: the caller's tensor stays unwritten
            a, b = buf[0::2], buf[1::2]  # ((s + 1) // 2) and (s // 2) rows, equal here
            for _name, _factor in case.steps:
                a, b = bucket_pair.maybe_inplace(a, b)  # both rows of one buffer donated
                a, b = a.relu() + 1, b + 0
            return a * 1, b * 1
        return (scale_steps(args[0]) * 1,)

    return fn


@dataclass
class BucketStats:
    compiles: int = 0
    calls: int = 0
    runtime_selected: int = 0  # nodes left to select at run time (logged once each)
    both_fail: int = 0  # programs plain Inductor cannot compile either
    failures: list[str] = field(default_factory=list)
    forms: Counter[str] = field(default_factory=Counter)


def check_bucket_case(case: BucketCase, stats: BucketStats) -> None:
    """Compile ``case`` once (dynamic sizes) and call it at its sizes: each output must
    equal eager's under the same tables, bit for bit. A program plain Inductor
    cannot compile either is counted, not failed."""
    from contextlib import ExitStack

    fn = bucket_program(case)
    backend = ir.VllmIRBackend(priority=case.tables, bucket_dispatch=case.dispatch)  # type: ignore[arg-type]
    stats.forms[case.form] += 1

    def run(compiled: Callable[..., Any], rows: int) -> tuple[Any, Any]:
        with ExitStack() as stack:
            for name, table in case.tables.items():
                stack.enter_context(BUCKET_OPS[name].set_priority(table))
            want = fn(*_bucket_inputs(case, rows))
            got = compiled(*_bucket_inputs(case, rows))
        return want, got

    torch._dynamo.reset()
    with torch.no_grad(), torch._dynamo.config.patch(capture_scalar_outputs=True):
        compiled = torch.compile(fn, backend=backend, dynamic=True)
        for rows in case.sizes:
            try:
                want, got = run(compiled, rows)
            except Exception as e:
                inner = getattr(e, "inner_exception", None) or e
                error = f"{type(inner).__name__}: {str(inner).splitlines()[0][:200]}"
                torch._dynamo.reset()
                try:
                    run(torch.compile(fn, backend="inductor", dynamic=True), rows)
                except Exception:
                    stats.both_fail += 1
                    return
                stats.failures.append(f"{case.describe()}: raises {error} at {rows} tokens")
                return
            stats.calls += 1
            if not all(torch.equal(a, b) for a, b in zip(want, got, strict=True)):
                stats.failures.append(f"{case.describe()}: wrong result at {rows} tokens")
                return
    stats.compiles += len(backend.pass_contexts)
    stats.runtime_selected += sum(
        provider == "<runtime>"
        for ctx in backend.pass_contexts
        for nodes in ctx.selected_impls.values()
        for provider in nodes.values()
    )
