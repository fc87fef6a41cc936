"""``vllm-ir ops``: every op x provider on this machine, and providers that failed."""

from __future__ import annotations

import argparse
import inspect
import json
from collections.abc import Iterable

from vllm_ir._base.platform import current_platform, describe, device_type, platforms
from vllm_ir._cli.table import render_table
from vllm_ir._discovery.providers import load_errors, loaded_providers
from vllm_ir._op.op import IrOp

__all__ = ["op_table_markdown", "run"]

_TABLE_DTYPES = (("fp32", "float32"), ("fp16", "float16"), ("bf16", "bfloat16"))


def _signature(op: IrOp) -> str:
    def text(annotation: object) -> str:
        return inspect.formatannotation(annotation).replace("torch.", "")

    params = []
    for param in op.signature.parameters.values():
        item = f"{param.name}: {text(param.annotation)}"
        if param.default is not param.empty:
            item += f" = {param.default!r}"
        params.append(item)
    return f"({', '.join(params)}) -> {text(op.signature.return_annotation)}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def op_table_markdown(ops: Iterable[IrOp]) -> str:
    """The Markdown table of ``ops`` that the docs embed: signature, the first line of
    the native function's docstring, activations, tolerances against native per dtype.

    Generated so that it cannot drift from the registry (a test compares the docs'
    copies with it); ``vllm-ir ops --markdown`` prints it.
    """
    import torch

    headers = ("Op", "Signature", "Semantics (the native function)", "Activations")
    rows = [f"| {' | '.join(headers)} | Tolerance (atol / rtol) |", "|---|---|---|---|---|"]
    for op in sorted(ops, key=lambda o: o.name):
        doc = inspect.getdoc(op.native) or ""
        semantics = doc.strip().splitlines()[0].replace("``", "`") if doc.strip() else ""
        activations = ", ".join(f"`{a}`" for a in op.activations)
        if op.allow_inplace:
            activations += " (`maybe_inplace` may reuse them)"
        tolerances = "; ".join(
            f"{short} {t.atol:g} / {t.rtol:g}"
            for short, name in _TABLE_DTYPES
            for t in [op.tolerance(getattr(torch, name))]
        )
        rows.append(
            f"| `{op.name}` | `{_cell(_signature(op))}` | {_cell(semantics)} | "
            f"{activations} | {tolerances} |"
        )
    return "\n".join(rows)


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


def _device_type() -> str | None:
    try:
        return device_type()
    except LookupError:  # VLLM_IR_PLATFORM names an installed platform that did not load
        return None


def run(args: argparse.Namespace) -> int:
    if args.markdown:
        print(op_table_markdown(IrOp.registry.values()))
        return 0
    rows = _rows()
    errors = load_errors()
    if args.json:
        print(
            json.dumps(
                {
                    "platform": current_platform(),
                    "platform_device_type": _device_type(),
                    "declared_platforms": {
                        name: {
                            "package": p.package,
                            "device_type": p.platform.device_type,
                            "privateuse1": p.platform.privateuse1,
                        }
                        for name, p in sorted(platforms().items())
                    },
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
    print(f"platform: {describe()}")
    declared = platforms()
    if declared:
        print(
            "declared platforms: "
            + ", ".join(f"{n} ({p.package})" for n, p in sorted(declared.items()))
        )
    print(
        render_table(
            ["op", "provider", "supported", "inplace", "batch invariant", "package"], table
        )
    )
    loaded = loaded_providers()
    names = ", ".join(f"{k} ({v.package})" for k, v in sorted(loaded.items()))
    print(f"\nproviders loaded: {names or 'none'}")
    for name, error in sorted(errors.items()):
        what = "platform" if name.endswith(" (platform)") else "provider"
        name = name.removesuffix(" (platform)")
        print(f"{what} {name} ({error.package}) failed to load: {error.cause}")
    return 0
