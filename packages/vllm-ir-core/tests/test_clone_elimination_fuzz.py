"""Differential fuzzing of clone elimination.

Random programs over two graph inputs mix views (slicing, ``t``, aliasing
``reshape``, ``as_strided``, ``unbind``/getitem), clones, ATen in-place ops,
an opaque in-place kernel and functional ops, and return a random subset of
their values. Each is traced to an FX graph, some clones of graph inputs are
marked donated, and the graph runs with and without clone elimination: the
outputs, and every non-donated input, must be bit-identical.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import stand_in_kernels  # noqa: F401  (defines vllm_ir_test::scale_)
import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx
from vllm_ir.compilation import eliminate_clones
from vllm_ir.compilation.lowering import ACTIVATION_CLONE_META

GRAPHS = 400
SHAPE = (4, 6)


def random_program(rng: random.Random):  # type: ignore[no-untyped-def]
    steps = [rng.randrange(13) for _ in range(rng.randint(3, 14))]
    picks = [rng.random() for _ in range(64)]
    outputs = rng.sample(range(8), k=rng.randint(1, 4))

    def program(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = [a, b]
        it = iter(picks)

        def pick() -> torch.Tensor:
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
            elif step in (9, 12):
                torch.ops.vllm_ir_test.scale_(t, 3.0)
            elif step == 10:
                values.append(t * 2 + 1)
            else:
                values.append(t.sum(-1, keepdim=True) + pick().sum())
        return tuple(values[-1 - (i % len(values))] for i in outputs)

    return program


def mark_donations(gm: fx.GraphModule, rng: random.Random) -> set[str]:
    """Mark clones of graph inputs donated at random; returns the donated inputs."""
    donated = set()
    for node in gm.graph.nodes:
        if node.target is torch.ops.aten.clone.default and node.args[0].op == "placeholder":
            flag = rng.random() < 0.6
            node.meta[ACTIVATION_CLONE_META] = {"op": "fuzz", "argument": "x", "donated": flag}
            if flag:
                donated.add(node.args[0].name)
    return donated


def run(gm: fx.GraphModule, a: torch.Tensor, b: torch.Tensor):  # type: ignore[no-untyped-def]
    a, b = a.clone(), b.clone()
    outs = tuple(o.clone() for o in gm(a, b))
    return outs, (a, b)


def test_clone_elimination_differential_fuzz(capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(1234)
    removed_total = tried = 0
    kept_reasons: Counter[str] = Counter()
    for _ in range(GRAPHS):
        program = random_program(rng)
        a, b = torch.randn(*SHAPE), torch.randn(*SHAPE)
        try:
            gm = make_fx(program, tracing_mode="fake")(a, b)
        except RuntimeError:
            continue  # e.g. an in-place op on an expanded view: not a valid program
        tried += 1
        donated = mark_donations(gm, rng)
        want_outs, want_inputs = run(gm, a, b)
        removed, kept = eliminate_clones(gm.graph)
        kept_reasons.update(reason.split(":")[0] for reason in kept.values())
        gm.recompile()
        removed_total += removed
        got_outs, got_inputs = run(gm, a, b)
        context = f"program {tried}, donated {sorted(donated)}:\n{gm.graph}"
        for got, want in zip(got_outs, want_outs, strict=True):
            torch.testing.assert_close(got, want, atol=0, rtol=0, msg=context)
        for name, got, want in zip(("a_1", "b_1"), got_inputs, want_inputs, strict=True):
            if name not in donated:
                torch.testing.assert_close(got, want, atol=0, rtol=0, msg=context)
    with capsys.disabled():
        print(f"\nclone-elimination fuzz: {tried} graphs, {removed_total} clones removed")
        print(f"clones kept, by reason: {dict(kept_reasons.most_common())}")
    assert tried > GRAPHS * 0.8
    assert removed_total > GRAPHS // 10  # the pass had real work to do
