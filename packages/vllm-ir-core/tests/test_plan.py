"""vllm_ir.plan: every IR op call site of one run, eager and compiled."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
import vllm_ir as ir
from torch import Tensor, nn
from vllm_ir._op.callsite import bucket_of, module_path_of, token_count
from vllm_ir._selection.buckets import ALL_SIZES
from vllm_ir._tools.planning import Plan, PlanFormatError


def _big_only(x: Tensor, factor: float) -> bool:
    return x.shape[0] > 16  # a kernel for prefill sizes only


def _times(x: Tensor, factor: float) -> Tensor:
    return x * factor


class Scale(nn.Module):
    def __init__(self, op: ir.IrOp) -> None:
        super().__init__()
        self.op = op

    def forward(self, x: Tensor) -> Tensor:
        return self.op(x, 2.0)


class Block(nn.Module):
    def __init__(self, op: ir.IrOp) -> None:
        super().__init__()
        self.scale = Scale(op)
        self.norm_weight = nn.Parameter(torch.ones(8))

    def forward(self, x: Tensor) -> Tensor:
        return ir.ops.rms_norm(self.scale(self.scale(x)), self.norm_weight, 1e-6)


class Model(nn.Module):
    def __init__(self, op: ir.IrOp) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(op), Block(op)])

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.fixture
def model(scale_op: ir.IrOp) -> Model:
    scale_op.register_impl("prefill_kernel", supports_args=_big_only)(_times)
    scale_op.register_impl("unlisted")(_times)
    return Model(scale_op)


def test_eager_plan_lists_every_call_site(model: Model, scale_op: ir.IrOp) -> None:
    with scale_op.set_priority(["prefill_kernel", "native"]):
        plan = ir.plan(model, torch.randn(4, 8))
    assert plan.mode == "eager"
    assert not plan.mismatches
    sites = [(s.site, s.op, s.count) for s in plan]
    # the scale module runs twice per block: one site, counted twice
    assert sites == [
        ("layers.0.scale", scale_op.name, 2),
        ("layers.0", "rms_norm", 1),
        ("layers.1.scale", scale_op.name, 2),
        ("layers.1", "rms_norm", 1),
    ]
    scale = plan.sites[0]
    assert (scale.tokens, scale.bucket, scale.ran) == (4, ALL_SIZES, "native")
    assert scale.args == ("x: float32[4, 8] cpu", "factor=2.0")
    notes = {c.provider: (c.status, c.reason) for c in scale.candidates}
    assert notes["prefill_kernel"] == (
        "rejected",
        "arguments not supported (supports_args returned False)",
    )
    assert notes["native"][0] == "ran"
    assert notes["unlisted"] == ("not listed", "accepts, but the priority list does not name it")
    assert plan.by_op()[scale_op.name] == {"native": 4}


def test_the_impl_that_ran_follows_the_size(model: Model, scale_op: ir.IrOp) -> None:
    """Decode and prefill sizes: each site reports what op.selected_impl runs for it."""
    for rows, bucket, ran in [(1, ALL_SIZES, "native"), (300, ALL_SIZES, "prefill_kernel")]:
        x = torch.randn(rows, 8)
        with scale_op.set_priority(["prefill_kernel", "native"]):
            plan = ir.plan(model, x)
            assert ran == scale_op.selected_impl(x, 2.0).provider
        scale = plan.sites[0]
        assert (scale.bucket, scale.ran) == (bucket, ran)
        native = next(c for c in scale.candidates if c.provider == "native")
        if ran == "prefill_kernel":
            assert (native.status, native.reason) == (
                "lost",
                "accepts, but prefill_kernel is earlier on the priority list",
            )
        else:
            assert native.status == "ran"


def test_a_selection_cache_that_disagrees_is_reported(
    model: Model, scale_op: ir.IrOp, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrong = scale_op.impls["unlisted"]
    monkeypatch.setattr(scale_op, "selected_impl", lambda *args: wrong)
    plan = ir.plan(model, torch.randn(2, 8))
    bad = plan.mismatches
    assert bad
    assert bad[0].ran == "unlisted"
    assert "select() chooses 'native'" in (bad[0].mismatch or "")
    assert "MISMATCH at layers.0.scale" in plan.table()


def test_a_priority_change_between_the_reads_is_no_mismatch(
    model: Model, scale_op: ir.IrOp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another thread's apply() landing between the plan's two reads (the selection
    cache, then select()) is read again in one state, not reported as a mismatch."""
    cached = scale_op.selected_impl
    landed: list[bool] = []

    def then_another_thread_applies(*args: object) -> ir.IrOpImpl:
        impl = cached(*args)
        if not landed:
            landed.append(True)
            change = ir.IrOpPriorityConfig(**{scale_op.name: ["unlisted"]}).apply
            thread = threading.Thread(target=change)
            thread.start()
            thread.join()
        return impl

    monkeypatch.setattr(scale_op, "selected_impl", then_another_thread_applies)
    plan = ir.plan(model, torch.randn(2, 8))
    assert landed
    assert not plan.mismatches
    assert [s.ran for s in plan.sites if s.op == scale_op.name] == ["unlisted", "unlisted"]
    assert not plan.notes


def test_other_threads_modules_do_not_name_the_sites(scale_op: ir.IrOp) -> None:
    """The global module hooks fire for every thread: a module another thread is
    running while the plan records a call is not where that call was made."""
    entered, leave = threading.Event(), threading.Event()

    class Serving(nn.Module):  # another thread's model, mid-forward
        def forward(self, x: Tensor) -> Tensor:
            entered.set()
            leave.wait(10)
            return x

    class Inner(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            served = threading.Thread(target=Serving(), args=(x,))
            served.start()
            entered.wait(10)
            try:  # the innermost module running anywhere is now Serving
                return scale_op(x, 2.0)
            finally:
                leave.set()
                served.join()

    class Planned(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Inner()

        def forward(self, x: Tensor) -> Tensor:
            return scale_op(self.inner(x), 2.0)

    inner, root = (s.site for s in ir.plan(Planned(), torch.randn(2, 8)).sites)
    assert inner == "inner"
    assert root.startswith("test_plan.py:")  # the root by its source line


def test_plain_functions_are_placed_by_source_line(scale_op: ir.IrOp) -> None:
    def step(x: Tensor) -> Tensor:
        return scale_op(x, 3.0)  # the call site

    plan = ir.plan(step, torch.ones(2, 3, 8))
    (site,) = plan.sites
    assert site.site.startswith("test_plan.py:")
    assert site.site.endswith("(step)")
    assert site.tokens == 6


def test_plan_leaves_nothing_installed(model: Model) -> None:
    ir.plan(model, torch.randn(2, 8))
    assert torch._C._len_torch_dispatch_stack() == 0
    assert not torch.nn.modules.module._global_forward_pre_hooks
    assert not torch.nn.modules.module._global_forward_hooks


def test_plan_survives_an_exception(scale_op: ir.IrOp) -> None:
    def fails(x: Tensor) -> Tensor:
        scale_op(x, 1.0)
        raise KeyError("boom")

    with pytest.raises(KeyError):
        ir.plan(fails, torch.ones(2))
    assert torch._C._len_torch_dispatch_stack() == 0
    assert not torch.nn.modules.module._global_forward_pre_hooks


def test_plan_round_trips_through_json(model: Model, tmp_path: object) -> None:
    plan = ir.plan(model, torch.randn(2, 8))
    assert Plan.from_json(plan.to_json()) == plan
    assert "layers.1.scale" in str(plan)
    doc = json.loads(plan.to_json())
    assert doc["format"] == "vllm-ir-plan"
    assert doc["sites"][0]["count"] == 2


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "not JSON"),
        ("[]", "not a vllm-ir plan"),
        ('{"format": "vllm-ir-plan", "version": 9}', "plan version 9"),
        ('{"format": "vllm-ir-plan", "version": 1, "mode": "eager"}', "missing key"),
        (
            '{"format": "vllm-ir-plan", "version": 1, "mode": "eager", "platform": "cpu",'
            ' "batch_invariant": "no", "sites": []}',
            "'batch_invariant' must be a bool",
        ),
    ],
)
def test_bad_plan_files_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(PlanFormatError, match=says):
        Plan.from_json(text)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("notes", "abc", "'notes' must be a list, got 'abc'"),
        ("count", True, "'count' must be an int, got True"),
        ("count", -3, "'count' must be at least 1, got -3"),
        ("count", 0, "'count' must be at least 1, got 0"),
        ("tokens", False, "'tokens' must be an integer, a string or null"),
    ],
)
def test_plan_fields_of_the_wrong_kind_are_refused(
    model: Model, field: str, value: object, says: str
) -> None:
    """A string is not a list of notes, and a bool or a count below 1 is not a count."""
    doc = json.loads(ir.plan(model, torch.randn(2, 8)).to_json())
    if field == "notes":
        doc["notes"] = value
    else:
        doc["sites"][0][field] = value
    with pytest.raises(PlanFormatError, match=says) as e:
        Plan.from_json(json.dumps(doc))
    assert "\n" not in str(e.value)


def test_plan_is_served_beside_the_twenty_names() -> None:
    from vllm_ir._tools import planning

    assert ir.plan is planning.plan
    assert ir.Plan is planning.Plan
    assert len(ir.__all__) <= 20
    assert "plan" not in ir.__all__


def test_batch_invariance_in_force_is_recorded(
    model: Model, scale_op: ir.IrOp, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    ir.invalidate_caches()
    with scale_op.set_priority(["unlisted"]):
        plan = ir.plan(model, torch.randn(2, 8))
    assert plan.batch_invariant
    assert "batch invariance on" in plan.table()
    scale = plan.sites[0]
    assert (scale.ran, scale.batch_invariant) == ("native", True)
    unlisted = next(c for c in scale.candidates if c.provider == "unlisted")
    assert (unlisted.status, unlisted.reason) == (
        "rejected",
        "not batch invariant (VLLM_BATCH_INVARIANT=1)",
    )


BUCKETS = [{"max_tokens": 16, "priority": ["native"]}, {"priority": ["unlisted", "native"]}]
"""A bucketed table for the scale op: native for decode sizes, ``unlisted`` above."""


def test_token_counts_and_buckets(scale_op: ir.IrOp) -> None:
    """Tokens are op.tokens; the bucket is the op's effective table's (none: all sizes)."""
    assert token_count(ir.ops.rms_norm, (torch.ones(3, 5, 8), None, 1e-6, None)) == 15
    assert bucket_of(scale_op, (torch.ones(40, 8), 2.0)) == ALL_SIZES
    three = [{"max_tokens": 16, "priority": []}, {"max_tokens": 256, "priority": []}]
    with scale_op.set_priority([*three, {"priority": []}]):
        labels = [bucket_of(scale_op, (torch.ones(t, 8), 2.0)) for t in (1, 16, 17, 256, 257)]
    assert labels == ["<=16", "<=16", "<=256", "<=256", ">256"]
    stack = {"a": ("L['self'].layers[0]", nn.Module), "b": ("L['self'].layers[0].mlp", nn.Module)}
    meta = {"nn_module_stack": stack}
    assert module_path_of(meta) == "layers.0.mlp"


def test_compiled_plan_names_the_modules_of_the_nodes(scale_op: ir.IrOp) -> None:
    """One compile: the lowering's choices per node, at the eager plan's sites."""
    model = Model(scale_op)
    x = torch.randn(4, 8)
    eager = ir.plan(model, x)
    compiled = torch.compile(model, backend=ir.VllmIRBackend(priority={"rms_norm": ["native"]}))
    with torch.no_grad():
        plan = ir.plan(compiled, x)
    assert plan.mode == "compiled"
    assert {(s.site, s.op, s.count) for s in plan} == {(s.site, s.op, s.count) for s in eager}
    norm = next(s for s in plan if s.op == "rms_norm")
    assert norm.ran == "native"
    assert norm.bucket == ALL_SIZES  # no table of rms_norm has buckets
    assert Plan.from_json(plan.to_json()) == plan
    with torch.no_grad(), pytest.raises(RuntimeError, match="lowered no IR op"):
        ir.plan(compiled, x)  # already compiled for these inputs: nothing to record


def test_eager_plan_names_the_bucket_of_the_table(model: Model, scale_op: ir.IrOp) -> None:
    with scale_op.set_priority(BUCKETS):
        small, big = ir.plan(model, torch.randn(4, 8)), ir.plan(model, torch.randn(32, 8))
    for p, bucket, ran in ((small, "<=16", "native"), (big, ">16", "unlisted")):
        scales = [s for s in p if s.op == scale_op.name]
        assert {(s.bucket, s.ran) for s in scales} == {(bucket, ran)}
        assert not p.mismatches


@pytest.mark.parametrize("dispatch", ["branches", "graphs"])
def test_compiled_plan_lists_each_bucket_branch(scale_op: ir.IrOp, dispatch: str) -> None:
    """One compile, token dim dynamic: the lowering branches per bucket (torch.cond),
    or compiles a graph per size range; the plan has one site per branch (or size
    range) with the impl it runs."""
    scale_op.register_impl("unlisted")(_times)  # no supports_args: asked on symbolic sizes
    model = Model(scale_op)
    torch._dynamo.reset()
    # rms_norm: buckets that all select native, merged into one impl (no branch)
    same = [{"max_tokens": 16, "priority": ["native"]}, {"priority": ["native"]}]
    backend = ir.VllmIRBackend(
        priority={scale_op.name: BUCKETS, "rms_norm": same}, bucket_dispatch=dispatch
    )
    compiled = torch.compile(model, backend=backend, dynamic=True)
    try:
        with torch.no_grad():
            plan = ir.plan(compiled, torch.randn(4, 8))
    finally:
        torch._dynamo.reset()
    lowered = set(backend.lowering_pass.selected_impls[scale_op.name].values())
    assert lowered == {"<=16:native;unlisted"}
    assert len(backend.pass_contexts) == (2 if dispatch == "graphs" else 1)
    scales = [s for s in plan if s.op == scale_op.name]
    by_site: dict[str, set[tuple[str, str]]] = {}
    for s in scales:
        by_site.setdefault(s.site, set()).add((s.bucket, s.ran))
        assert isinstance(s.tokens, str)  # the symbolic count
    assert set(by_site) == {"layers.0.scale", "layers.1.scale"}
    assert all(v == {("<=16", "native"), (">16", "unlisted")} for v in by_site.values())
    big = next(s for s in scales if s.bucket == ">16")
    native = next(c for c in big.candidates if c.provider == "native")
    assert native.status == "lost"  # candidates answered at the branch's sizes
    table = plan.table()
    assert f"layers.0.scale {scale_op.name} [<=16]: ran native" in table
    assert f"layers.0.scale {scale_op.name} [>16]: ran unlisted" in table
    norms = [s for s in plan if s.op == "rms_norm"]
    # a graph per size range: each range's graph ran native (one branch: all sizes)
    ranges = {("<=16", "native"), (">16", "native")} if dispatch == "graphs" else None
    assert {(s.bucket, s.ran) for s in norms} == (ranges or {(ALL_SIZES, "native")})
    # candidates answered at a size, not for the whole (ambiguous) range
    assert all(c.provider != "?" for s in norms for c in s.candidates)
    assert Plan.from_json(plan.to_json()) == plan


# -- vllm-ir explain --plan ---------------------------------------------------------


def _explain_plan(path: object, *more: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from vllm_ir_cli import main

    status = main(["explain", "--plan", str(path), *more])
    out = capsys.readouterr()
    return status, out.out + out.err


def test_explain_prints_a_saved_plan(
    model: Model, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plan.json"
    ir.plan(model, torch.randn(2, 8)).to_json(path)
    status, out = _explain_plan(path, capsys=capsys)
    assert status == 0
    assert "layers.1.scale" in out
    assert "candidates per call site" in out
    status, out = _explain_plan(path, "rms_norm", capsys=capsys)
    assert status == 0
    assert "layers.0 " in out
    assert "scale" not in out


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "cannot read it (No such file or directory)"),
        ("{", "not a kernel plan (not JSON"),
        ('{"ir_op_priority": {}}', 'not a kernel plan (not a vllm-ir plan (no "format"'),
    ],
)
def test_explain_refuses_a_bad_plan_file_in_one_line(
    content: str | None, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    status, out = _explain_plan(path, capsys=capsys)
    assert status == 2
    assert out.count("\n") == 1
    assert says in out
    assert "Traceback" not in out


def test_the_summary_names_every_impl_that_never_ran_and_why(scale_op: ir.IrOp) -> None:
    """The silent misses: rejected at every site, listed but never reached, not listed."""
    scale_op.register_impl("fast", supports_args=lambda x, factor: True)(_times)
    scale_op.register_impl("declines", supports_args=lambda x, factor: False)(_times)
    scale_op.register_impl("later", supports_args=lambda x, factor: True)(_times)
    scale_op.register_impl("unlisted", supports_args=lambda x, factor: True)(_times)
    model = nn.Sequential(Scale(scale_op), Scale(scale_op))
    with scale_op.set_priority(["declines", "fast", "later"]):
        p = ir.plan(model, torch.randn(4, 8))
    s = p.summary()[scale_op.name]
    assert (s.calls, s.sites, s.ran) == (2, 2, {"fast": 2})
    assert s.never_ran == {
        "declines": {
            "status": "rejected",
            "reasons": ["arguments not supported (supports_args returned False)"],
        },
        "later": {
            "status": "unreached",
            "reasons": ["accepts, but fast is earlier on the priority list"],
        },
        "native": {
            "status": "unreached",
            "reasons": ["accepts, but fast is earlier on the priority list"],
        },
        "unlisted": {
            "status": "not listed",
            "reasons": ["accepts, but the priority list does not name it"],
        },
    }
    line = s.line()
    assert line.startswith(f"{scale_op.name}: 2 calls at 2 sites; ran fast (2); never ran: ")
    assert "declines (rejected at every site: arguments not supported" in line
    assert "later (accepts, never reached: an earlier entry ran)" in line
    assert "unlisted (accepts, not on the priority list)" in line
    assert f"per op:\n  {line}" in p.table()
    doc = json.loads(p.to_json())
    assert doc["summary"][scale_op.name]["never_ran"] == s.never_ran
    assert Plan.from_json(p.to_json()) == p  # the summary is derived, not read back


def test_picks_that_lose_at_a_measured_size_are_listed(scale_op: ir.IrOp) -> None:
    """Against a tune --model document: slower by more than the margin at a size it
    measured is listed; within the margin, or at a size it did not measure, is not."""
    scale_op.register_impl("fast", supports_args=lambda x, factor: True)(_times)
    model = nn.Sequential(Scale(scale_op))
    with scale_op.set_priority(["native"]):
        small, big = ir.plan(model, torch.randn(4, 8)), ir.plan(model, torch.randn(64, 8))

    def doc(native_us: float) -> dict[str, object]:
        times = {"default": {"median_us": native_us}, "native": {"median_us": native_us}}
        times["fast"] = {"median_us": 10.0}
        ops = {scale_op.name: {"<=16": {"times_us": {"4": times}}}}
        return {"_measurements": {"ops": ops}}

    (pick,) = small.losing_picks(doc(20.0))
    assert (pick.op, pick.tokens, pick.ran, pick.best, pick.speedup) == (
        scale_op.name,
        4,
        "native",
        "fast",
        2.0,
    )
    assert small.losing_picks(doc(10.4)) == []  # within the 5 % margin
    assert small.losing_picks(doc(10.4), margin=0.01) != []
    assert big.losing_picks(doc(20.0)) == []  # 64 tokens were not measured
    assert small.losing_picks({"ir_op_priority": {}}) == []  # no figures: nothing judged


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("[" * 100_000 + "]" * 100_000, "nests deeper than"),
        ("[1]", "a tuning document is a JSON object"),
        ("{}", "no _measurements"),
        ('{"_measurements": {"ops": [1]}}', "must map op names"),
        (b"\xff\xfe", "cannot read a tuning file"),
    ],
)
def test_plan_refuses_a_bad_tuned_file_in_one_line(
    content: str | bytes, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``vllm-ir plan PLAN --tuned FILE``: exit 2 and one line, also for JSON
    nested deeper than ``json`` recurses (reliability-v4 11)."""
    from vllm_ir_cli import main

    plan = tmp_path / "plan.json"
    plan.write_text(Plan(mode="eager", platform="cpu", batch_invariant=False).to_json())
    tuned = tmp_path / "tuned.json"
    tuned.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert main(["plan", str(plan), "--tuned", str(tuned)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert says in err


@pytest.mark.parametrize("margin", [float("nan"), -0.5, 1.0, 1.5, "0.1"])
def test_losing_picks_refuses_a_margin_outside_zero_to_one(margin: object) -> None:
    """A negative margin would report winning picks as losing; nan judges nothing
    (reliability-v4 18)."""
    with pytest.raises(ValueError, match="margin must be at least 0 and below 1"):
        Plan(mode="eager", platform="cpu", batch_invariant=False).losing_picks({}, margin=margin)  # type: ignore[arg-type]


@pytest.mark.parametrize("doc", [[1], {"_measurements": [1]}, {"_measurements": {"ops": [1]}}])
def test_losing_picks_refuses_a_document_that_is_no_sweep(doc: object) -> None:
    with pytest.raises(ValueError, match="tune --model"):
        Plan(mode="eager", platform="cpu", batch_invariant=False).losing_picks(doc)  # type: ignore[arg-type]
