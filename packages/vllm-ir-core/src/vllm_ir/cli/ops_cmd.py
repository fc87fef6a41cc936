"""``vllm-ir ops``: every op x provider on this machine, and providers that failed."""

from __future__ import annotations

import argparse
import json

from vllm_ir.cli.table import render_table
from vllm_ir.op import IrOp
from vllm_ir.platform import current_platform
from vllm_ir.providers import load_errors, loaded_providers

__all__ = ["run"]


def _rows() -> list[dict[str, object]]:
    rows = []
    for name, op in sorted(IrOp.registry.items()):
        for provider, impl in sorted(op.impls.items()):
            rows.append(
                {
                    "op": name,
                    "provider": provider,
                    "supported": impl.supported,
                    "reason": ""
                    if impl.supported
                    else impl.unsupported_reason
                    or f"registered unsupported on {current_platform()}",
                    "inplace": impl.inplace,
                    "batch_invariant": impl.batch_invariant,
                    "package": impl.package,
                }
            )
    return rows


def run(args: argparse.Namespace) -> int:
    rows = _rows()
    errors = load_errors()
    if args.json:
        print(
            json.dumps(
                {
                    "platform": current_platform(),
                    "impls": rows,
                    "providers": {k: v.package for k, v in loaded_providers().items()},
                    "failed_providers": {
                        k: {"package": e.package, "cause": e.cause} for k, e in errors.items()
                    },
                },
                indent=2,
            )
        )
        return 0
    yes_no = {True: "yes", False: "no"}
    table = [
        [
            r["op"],
            r["provider"],
            "yes" if r["supported"] else f"no ({r['reason']})",
            yes_no[bool(r["inplace"])],
            yes_no[bool(r["batch_invariant"])],
            r["package"],
        ]
        for r in rows
    ]
    print(f"platform: {current_platform()}")
    print(
        render_table(
            ["op", "provider", "supported", "inplace", "batch invariant", "package"], table
        )
    )
    loaded = loaded_providers()
    names = ", ".join(f"{k} ({v.package})" for k, v in sorted(loaded.items()))
    print(f"\nproviders loaded: {names or 'none'}")
    for name, error in sorted(errors.items()):
        print(f"provider {name} ({error.package}) failed to load: {error.cause}")
    return 0
