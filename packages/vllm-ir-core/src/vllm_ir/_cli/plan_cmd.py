"""``vllm-ir explain --plan FILE.json``: print a kernel plan saved by ``vllm_ir.plan``."""

from __future__ import annotations

from pathlib import Path

from vllm_ir._cli.args import UsageError
from vllm_ir._tools.planning import Plan, PlanFormatError

__all__ = ["print_plan", "read_plan"]


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
