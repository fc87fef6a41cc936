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
