"""``vllm-ir plan``: a model's kernel plan, with what it silently misses; and
``vllm-ir explain --plan FILE.json``: print a plan saved by ``vllm_ir.plan``.

``vllm-ir plan --model SPEC --tokens 1,256`` builds the model as ``tune --model``
does (a model directory, a cached name, or ``module:callable``), plans one step
at each token count and prints, per count, the plan's table and one summary
line per op: the impls that ran, those registered but rejected at every call
site (with the reason), those listed but never reached, those not listed.
``--tuned FILE`` (what ``tune --model`` wrote) plans under the file (its
priorities applied as ``--ir-op-priority=@FILE`` would, stamps checked against
``--threads``) and adds the picks that lose to another candidate by more than
``--margin`` at a token count the sweep measured. ``vllm-ir plan FILE.json``
does the same for a saved plan; ``--json OUT`` writes the plans and those findings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any

from vllm_ir._base.registration import RegistrationHandle
from vllm_ir._base.text import json_nesting_depth
from vllm_ir._cli.args import UsageError, apply_threads, writable_file, write_atomically
from vllm_ir._tools.planning import Plan, PlanFormatError, sweep_measurements
from vllm_ir.config import MAX_PRIORITY_FILE_BYTES, IrOpPriorityConfig

__all__ = ["print_plan", "read_plan", "run"]


def read_plan(path: str) -> Plan:
    """The plan saved at ``path``; a :class:`UsageError` (one line, exit 2) if it is not one."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else e
        raise UsageError(f"--plan {path}: cannot read it ({reason})") from None
    try:
        return Plan.from_json(text)
    except PlanFormatError as e:
        raise UsageError(
            f"--plan {path}: not a kernel plan ({e}); write one with "
            "vllm_ir.plan(model, *inputs).to_json('FILE.json')"
        ) from None


def print_plan(path: str, op: str | None = None) -> int:
    """Print the plan at ``path`` (only ``op``'s call sites, when given)."""
    plan = read_plan(path)
    if op is not None:
        ops = {s.op for s in plan}
        if op not in ops:
            known = ", ".join(sorted(ops)) or "none"
            raise UsageError(f"--plan {path}: no call site of op {op!r} (ops in it: {known})")
        plan = Plan(
            plan.mode,
            plan.platform,
            plan.batch_invariant,
            tuple(s for s in plan if s.op == op),
            plan.notes,
        )
    print(f"{path}:")
    print(plan.table())
    return 0


_MAX_DEPTH = 32  # a tune --model document nests about eight levels


def _read_tuned(path: str) -> dict[str, Any]:
    try:
        # bounded: a stray huge file must not fill the memory
        with Path(path).open("rb") as f:
            data = f.read(MAX_PRIORITY_FILE_BYTES + 1)
        if len(data) > MAX_PRIORITY_FILE_BYTES:
            raise UsageError(
                f"--tuned {path}: the file is larger than {MAX_PRIORITY_FILE_BYTES // 2**20} MiB; "
                "give the file `vllm-ir tune --model` wrote"
            )
        text = data.decode("utf-8")
        if json_nesting_depth(text, _MAX_DEPTH) > _MAX_DEPTH:
            raise UsageError(
                f"--tuned {path}: nests deeper than {_MAX_DEPTH} levels, which no "
                "`vllm-ir tune --model` file does; give the file it wrote"
            )
        doc = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"--tuned {path}: cannot read a tuning file ({e})") from None
    try:
        measured = sweep_measurements(doc)
    except ValueError as e:
        raise UsageError(f"--tuned {path}: {e}") from None
    if measured is None:
        raise UsageError(
            f"--tuned {path}: not a `vllm-ir tune --model` file (it has no _measurements); "
            "losing picks are judged against a whole-model sweep"
        )
    return doc


def _applied(path: str) -> RegistrationHandle:
    """The file's priorities applied in the user layer (as ``--ir-op-priority=@FILE``)."""
    try:
        return IrOpPriorityConfig.from_json(Path(path)).apply()
    except (OSError, ValueError, TypeError) as e:
        raise UsageError(f"--tuned {path}: {e}") from None


def _plans(args: argparse.Namespace) -> dict[str, Plan]:
    """Label -> plan: the saved plan, or the model's at each ``--tokens`` count."""
    if (args.saved is None) == (args.model is None):
        raise UsageError("give a saved plan (FILE.json) or --model SPEC, one of them")
    if args.saved is not None:
        return {args.saved: read_plan(args.saved)}
    import torch

    from vllm_ir._cli.model_source import load_model
    from vllm_ir._cli.tune_model import parse_ints
    from vllm_ir._tools.planning import plan

    tokens = parse_ints("--tokens", args.tokens)
    source = load_model(args.model, tokens[0])
    plans = {}
    for count in tokens:
        inputs = source.example_inputs(count)
        with torch.inference_mode():
            found = (
                plan(source.model, **inputs)
                if isinstance(inputs, dict)
                else plan(source.model, *inputs)
            )
        plans[f"{count} tokens"] = found
    return plans


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.margin < 1:
        raise UsageError(f"--margin must be at least 0 and below 1, got {args.margin}")
    tuned = _read_tuned(args.tuned) if args.tuned else None
    out = writable_file("--json", args.json) if args.json else None
    with contextlib.ExitStack() as stack:
        if args.model is not None:
            print(apply_threads(args.threads))
            if tuned is not None and "ir_op_priority" in tuned:  # what a process given it runs
                stack.callback(_applied(args.tuned).remove)
        plans = _plans(args)
    report: dict[str, Any] = {}
    for label, found in plans.items():
        print(f"{label}:")
        print(found.table(candidates=False))  # with its per-op lines
        losing = found.losing_picks(tuned, margin=args.margin) if tuned is not None else []
        for pick in losing:
            print(
                f"  losing pick: {pick.site} ({pick.op}) ran {pick.ran} at {pick.tokens} tokens; "
                f"{pick.best} was {pick.speedup}x faster there"
            )
        if tuned is not None and not losing:
            print(f"  no pick loses by more than {args.margin:.0%} at a measured size")
        report[label] = {
            "plan": json.loads(found.to_json()),
            "losing_picks": [vars(p) for p in losing] if tuned is not None else None,
        }
    if out is not None:
        write_atomically("--json", out, json.dumps(report, indent=2) + "\n")
        print(f"wrote {out}")
    return 0
