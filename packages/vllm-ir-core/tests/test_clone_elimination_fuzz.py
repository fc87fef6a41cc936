"""Differential fuzzing of clone elimination.

Random programs over two graph inputs mix views (slicing, ``t``, aliasing
``reshape``, ``as_strided`` relative to the view and with an absolute storage
offset, ``unbind``/getitem), copies (``clone``, ``cat``), ATen in-place ops
(``add_``, ``copy_``), an opaque in-place kernel, writes without a schema (a
``triton_kernel_wrapper_mutation`` node built by hand, and a plain Python
function), extern kernels (``mm``) and pointwise readers, and return a random
subset of their values. The inputs are sometimes row slices of bigger tensors
(a storage offset), and some programs are traced with symbolic shapes.

Each is traced to an FX graph, and its clones get the lowering's record at
random: donated or not, with the graph inputs the caller donated with them
(``donated_inputs``) — sometimes fewer than the source aliases, as when
Inductor's no-op removal turned a donated copy back into its original. The
graph runs with and without clone elimination: the outputs, and the whole base
tensor of every input no record donated, must be bit-identical.

``VLLM_IR_FUZZ_PROGRAMS`` sets the number of programs (``nox -s fuzz`` runs
10,000); ``VLLM_IR_FUZZ_REPORT`` names a JSON file the counts are merged into.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import re
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import stand_in_kernels  # noqa: F401  (defines vllm_ir_test::scale_)
import torch
from torch import Tensor, fx
from torch.fx.experimental.proxy_tensor import make_fx
from vllm_ir.compilation import eliminate_clones
from vllm_ir.compilation._aliasing import AliasGroups
from vllm_ir.compilation._lowering import ACTIVATION_CLONE_META

PROGRAMS = int(os.environ.get("VLLM_IR_FUZZ_PROGRAMS", "600"))
SEED = int(os.environ.get("VLLM_IR_FUZZ_PASS_SEED", "1234"))
SHAPE = (4, 6)
HOP = torch.ops.higher_order.triton_kernel_wrapper_mutation


@torch.library.custom_op("vllm_ir_fuzz_pass::hop_marker_", mutates_args=("x",))
def _hop_marker(x: Tensor) -> None:
    """Traced in place of a Triton kernel; rewritten to a schema-less write."""
    x.mul_(-2.0)


def _hop_on_cpu(**hop_kwargs: Any) -> None:
    """What the Triton kernel of the hand-built HOP node does, runnable on CPU."""
    kwargs = hop_kwargs["kwargs"]
    kwargs["in_out_ptr"].mul_(-2.0)


def _schemaless_write(x: Tensor) -> None:
    """A plain Python function in the graph: no schema says what it writes."""
    x.mul_(-2.0)


def random_program(rng: random.Random):  # type: ignore[no-untyped-def]
    steps = [rng.randrange(18) for _ in range(rng.randint(3, 14))]
    picks = [rng.random() for _ in range(96)]
    outputs = rng.sample(range(8), k=rng.randint(1, 4))

    def program(a: Tensor, b: Tensor) -> tuple[Tensor, ...]:
        values = [a, b]
        it = iter(picks)

        def pick() -> Tensor:
            # favour the newest value, so clones get written and sources die
            u = next(it)
            return values[-1] if u < 0.5 else values[int((u - 0.5) * 2 * len(values))]

        for step in steps:
            t = pick()
            if step in (0, 1, 2):  # clones are the subject
                values.append(t.clone())
            elif step == 3:
                values.append(t[..., : max(1, t.shape[-1] // 2)])
            elif step == 4 and t.dim() == 2:
                values.append(t.t())
            elif step == 5 and t.is_contiguous():
                values.append(t.reshape(-1))
            elif step == 6:
                values.append(t.as_strided(t.shape, t.stride(), t.storage_offset()))
            elif step == 7 and t.dim() == 2:
                values.append(t.unbind(0)[0])
            elif step == 8:
                t.add_(1.5)
            elif step == 9:
                torch.ops.vllm_ir_test.scale_(t, 3.0)
            elif step == 10:
                values.append(t * 2 + 1)
            elif step == 11:
                values.append(t.sum(-1, keepdim=True) + pick().sum())
            elif step == 12:
                torch.ops.vllm_ir_fuzz_pass.hop_marker_(t)
            elif step == 13:
                # absolute storage offset 0: other memory when t has an offset
                values.append(t.as_strided(t.shape, t.stride(), 0))
            elif step == 14:
                values.append(torch.cat([t]))
            elif step == 15 and t.dim() == 2:
                values.append(t @ t.new_ones(t.shape[-1], 3))
            elif step == 16:
                u = pick()
                if u.shape == t.shape and u is not t:
                    t.copy_(u * 0.5)
            elif step == 17 and t.dim() == 2 and t.shape[0] >= 3:
                values.append(t[1:3])
        return tuple(values[-1 - (i % len(values))] for i in outputs)

    return program


def to_schemaless_writes(gm: fx.GraphModule, rng: random.Random) -> list[fx.Node]:
    """Replace the marker op by a ``triton_kernel_wrapper_mutation`` node (as the
    lowering traces ``wrap_triton``) or a plain Python function."""
    hops = []
    for node in list(gm.graph.nodes):
        if node.target is not torch.ops.vllm_ir_fuzz_pass.hop_marker_.default:
            continue
        (x,) = node.args
        with gm.graph.inserting_before(node):
            if rng.random() < 0.7:
                new = gm.graph.call_function(
                    HOP,
                    kwargs={
                        "kernel_idx": 0,
                        "constant_args_idx": 0,
                        "grid": [(1, 1, 1)],
                        "tma_descriptor_metadata": {},
                        "kwargs": {"in_out_ptr": x},
                    },
                )
                hops.append(new)
            else:
                new = gm.graph.call_function(_schemaless_write, (x,))
        new.meta["val"] = None
        gm.graph.erase_node(node)
    return hops


def set_hop_targets(hops: list[fx.Node], target: Any) -> None:
    for node in hops:
        node.target = target


def mark_donations(gm: fx.GraphModule, rng: random.Random) -> set[str]:
    """Give clones the lowering's record at random; returns the donated inputs.

    A donated record names the graph inputs its source aliases as
    ``donated_inputs`` — or, at random, only some of them: the caller donated a
    copy that Inductor turned back into the input itself.
    """
    aliases = AliasGroups(gm.graph)
    donated: set[str] = set()
    for node in gm.graph.nodes:
        if node.target is not torch.ops.aten.clone.default or rng.random() < 0.15:
            continue
        flag = rng.random() < 0.6
        inputs = sorted(m.name for m in aliases.aliases(node.args[0]) if m.op == "placeholder")
        granted = frozenset(n for n in inputs if rng.random() < 0.8) if flag else frozenset()
        node.meta[ACTIVATION_CLONE_META] = {
            "op": "fuzz",
            "argument": "x",
            "donated": flag,
            "donated_inputs": granted,
        }
        donated |= granted
    return donated


def make_inputs(rng: random.Random) -> tuple[list[Tensor], list[Tensor]]:
    """Two inputs, each either a whole tensor or rows 1..4 of a (6, 6) one."""
    bases, args = [], []
    for _ in range(2):
        if rng.random() < 0.25:
            base = torch.randn(SHAPE[0] + 2, SHAPE[1])
            args.append(base[1 : SHAPE[0] + 1])
        else:
            base = torch.randn(*SHAPE)
            args.append(base)
        bases.append(base)
    return bases, args


def run(gm: fx.GraphModule, bases: list[Tensor], args: list[Tensor]):  # type: ignore[no-untyped-def]
    fresh = [b.clone() for b in bases]
    views = [
        f.as_strided(a.shape, a.stride(), a.storage_offset())
        for f, a in zip(fresh, args, strict=True)
    ]
    results = gm(*views)
    storages = [r.untyped_storage().data_ptr() for r in results]
    inputs = [f.untyped_storage().data_ptr() for f in fresh]
    # which other outputs and which inputs each output shares memory with:
    # observable by a caller that writes an output
    sharing = [
        (
            frozenset(j for j, t in enumerate(storages) if t == s and j != i),
            frozenset(name for name, t in zip(("a_1", "b_1"), inputs, strict=True) if t == s),
        )
        for i, s in enumerate(storages)
    ]
    return tuple(o.clone() for o in results), fresh, sharing


def _reason_kind(reason: str) -> str:
    reason = re.sub(r"^\S+ reads", "a value reads", reason)
    reason = re.sub(r"used by \S+ after", "used after", reason)
    reason = re.sub(r"graph input [ab]_1\b", "graph input", reason)
    return reason.split(":")[0].split(", which")[0].strip()


def fuzz(programs: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    stats: dict[str, Any] = {"programs": 0, "invalid": 0, "symbolic": 0, "offset_inputs": 0}
    removed_total = 0
    kept_reasons: Counter[str] = Counter()
    miscompiles: list[str] = []
    start = time.perf_counter()
    for index in range(programs):
        program = random_program(rng)
        bases, args = make_inputs(rng)
        symbolic = all(a.storage_offset() == 0 for a in args) and rng.random() < 0.25
        try:
            gm = make_fx(program, tracing_mode="symbolic" if symbolic else "fake")(*args)
        except RuntimeError:
            stats["invalid"] += 1  # e.g. an in-place op on an expanded view
            continue
        stats["programs"] += 1
        stats["symbolic"] += symbolic
        stats["offset_inputs"] += any(a.storage_offset() for a in args)
        hops = to_schemaless_writes(gm, rng)
        donated = mark_donations(gm, rng)
        set_hop_targets(hops, _hop_on_cpu)
        gm.recompile()
        want_outs, want_bases, want_sharing = run(gm, bases, args)
        set_hop_targets(hops, HOP)
        before = str(gm.graph)
        removed, kept = eliminate_clones(gm.graph)
        kept_reasons.update(_reason_kind(r) for r in kept.values())
        removed_total += removed
        set_hop_targets(hops, _hop_on_cpu)
        gm.recompile()
        got_outs, got_bases, got_sharing = run(gm, bases, args)
        problems = [
            f"output {i} differs"
            for i, (g, w) in enumerate(zip(got_outs, want_outs, strict=True))
            if not torch.equal(g, w)
        ]
        for i, ((g_out, g_in), (w_out, w_in)) in enumerate(
            zip(got_sharing, want_sharing, strict=True)
        ):
            if g_out != w_out or (g_in - donated) != (w_in - donated):
                problems.append(f"output {i} shares memory with {g_out} {g_in}, not {w_out} {w_in}")
        for i, (name, g, w) in enumerate(zip(("a_1", "b_1"), got_bases, want_bases, strict=True)):
            if name in donated:
                if g.shape[0] > SHAPE[0]:  # the rows outside the input's slice
                    g, w = g[[0, -1]], w[[0, -1]]
                else:
                    continue
            if not torch.equal(g, w):
                problems.append(f"input {name} (base {i}) differs")
        if problems:
            offsets = [a.storage_offset() for a in args]
            miscompiles.append(
                f"program #{index} (seed {seed}), input offsets {offsets}, "
                f"donated {sorted(donated)}: "
                f"{'; '.join(problems)}\nbefore:{before}\nafter:{gm.graph}"
            )
    stats.update(
        clones_removed=removed_total,
        kept_by_reason=dict(kept_reasons.most_common()),
        miscompiles=len(miscompiles),
        seconds=round(time.perf_counter() - start, 1),
        seed=seed,
    )
    stats["examples"] = miscompiles[:3]
    return stats


def write_report(section: str, stats: dict[str, Any]) -> None:
    """Merge ``stats`` into the JSON file ``VLLM_IR_FUZZ_REPORT`` names, if any."""
    path = os.environ.get("VLLM_IR_FUZZ_REPORT")
    if not path:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # the two fuzz tests may finish at once, in two pytest-xdist workers
    with open(Path(tempfile.gettempdir()) / "vllm_ir_fuzz_report.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        report = json.loads(target.read_text()) if target.exists() else {}
        report[section] = {k: v for k, v in stats.items() if k != "examples"}
        report["torch"] = torch.__version__
        target.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


def report_family(
    section: str,
    capsys: pytest.CaptureFixture[str],
    stats: dict[str, Any],
    *,
    first_seed: int,
    start: float,
) -> dict[str, Any]:
    """``stats`` with the first seed and the seconds since ``start``, written under
    ``section`` (:func:`write_report`) and printed past pytest's capture."""
    report = {**stats, "first_seed": first_seed, "seconds": round(time.perf_counter() - start, 1)}
    write_report(section, report)
    with capsys.disabled():
        print(f"\n{section}: {report}")
    return report


@pytest.mark.slow
def test_clone_elimination_differential_fuzz(capsys: pytest.CaptureFixture[str]) -> None:
    stats = fuzz(PROGRAMS, SEED)
    write_report("pass_level", stats)
    with capsys.disabled():
        print(
            f"\nclone-elimination fuzz: {stats['programs']} programs "
            f"({stats['symbolic']} symbolic, {stats['offset_inputs']} with offset inputs), "
            f"{stats['clones_removed']} clones removed, {stats['miscompiles']} miscompiles, "
            f"{stats['seconds']} s"
        )
        print(f"clones kept, by reason: {stats['kept_by_reason']}")
    assert not stats["miscompiles"], "\n\n".join(stats["examples"])
    assert stats["programs"] > PROGRAMS * 0.8
    assert stats["clones_removed"] > PROGRAMS // 10  # the pass had real work to do
