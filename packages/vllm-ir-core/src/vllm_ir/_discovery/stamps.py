"""Stamps: the environment a tuned priority entry was measured in, checked on load.

A tuning file (what ``vllm-ir tune`` writes) gives each op's entry a stamp::

    "stamps": {"rms_norm": {"environment": {...}, "impls": {"cpu_c": {...}}}}

The environment is the device (a GPU's name and compute capability, or a CPU's
architecture, model and vector ISA), torch's thread count, and the versions of
torch, triton and vllm-ir; each impl the entry lists has the distribution it
came from and the fingerprint of its code (:func:`vllm_ir._base.fingerprint.code_fingerprint`).
A measurement says what was fastest *there*: when any of it differs here, the
entry is skipped with one warning line naming the difference, and the op keeps
what lies below the file (its defaults). ``VLLM_IR_ACCEPT_STALE=1``, or
``accept_stale=True`` where the file is loaded, applies such entries anyway.

>>> stamp = op_stamp("rms_norm", ["native"], "cpu")
>>> sorted(stamp), stamp_difference(stamp) is None
(['environment', 'impls'], True)
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from vllm_ir._base.fingerprint import code_fingerprint
from vllm_ir._base.logger import get_logger
from vllm_ir._op.op import IrOp
from vllm_ir._selection.buckets import BucketedPriority, as_priority
from vllm_ir._version import __version__

__all__ = [
    "device_keys",
    "device_table",
    "drop_stale",
    "environment",
    "op_stamp",
    "PROVING_FIELDS",
    "UNCHECKED",
    "stamp_difference",
    "stamps_of",
]

logger = get_logger(__name__)


@functools.cache
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _device(device: torch.device) -> dict[str, str]:
    """The device measured on; for a CPU also its vector ISA and the thread count
    (a GPU kernel's time does not depend on the host's threads)."""
    if device.type == "cuda" and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(device)
        return {
            "type": "cuda",
            "device": torch.cuda.get_device_name(device),
            "capability": f"{major}.{minor}",
        }
    xpu = getattr(torch, "xpu", None)
    if device.type == "xpu" and xpu is not None and xpu.is_available():
        return {"type": "xpu", "device": str(xpu.get_device_name(device))}
    isa = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")()
    return {
        "type": device.type,
        "device": f"{device.type}:{platform.machine()}:{_cpu_model()}",
        "isa": str(isa),
        "threads": str(torch.get_num_threads()),
    }


def environment(device: torch.device) -> dict[str, str]:
    """What a measurement on ``device`` depends on beyond its arguments and impls."""
    try:
        import triton  # type: ignore[import-not-found, unused-ignore]

        triton_version = str(triton.__version__)
    except ImportError:
        triton_version = "none"
    return {
        **_device(device),
        "torch": torch.__version__,
        "triton": triton_version,
        "vllm_ir": __version__,
    }


def device_keys() -> list[str]:
    """The names a provider's bundled tables may use for this machine, most
    specific first: the GPU's name (once torch has initialized CUDA: looking it
    up must not initialize it), the CPU's full name, ``cpu:<ISA>``."""
    keys = []
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        keys.append(torch.cuda.get_device_name())
    cpu = _device(torch.device("cpu"))
    return [*keys, cpu["device"], f"cpu:{cpu['isa']}"]


def device_table(tables: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The table of ``tables`` (device name -> table) for this machine, or None."""
    for key in device_keys():
        if key in tables:
            return tables[key]
    return None


def _impl_stamp(op: IrOp, provider: str) -> dict[str, str | None]:
    impl = op.impls.get(provider)
    if impl is None:
        return {"package": None, "code": None}
    return {"package": impl.package, "code": code_fingerprint(impl.impl_fn, impl.supports_args)}


def op_stamp(op_name: str, providers: Iterable[str], device_type: str) -> dict[str, Any]:
    """The stamp of ``op_name``'s entry listing ``providers``, measured on ``device_type``."""
    op = IrOp.registry[op_name]
    return {
        "environment": environment(torch.device(device_type)),
        "impls": {p: _impl_stamp(op, p) for p in dict.fromkeys(providers)},
    }


def _providers_in(entry: object, op_name: str) -> tuple[str, ...]:
    """The provider names of an entry's JSON form (a list of names or of buckets)."""
    spec = as_priority(entry, op_name)
    return spec.providers() if isinstance(spec, BucketedPriority) else spec


def stamps_of(priorities: Mapping[str, Any], device_type: str) -> dict[str, dict[str, Any]]:
    """The ``"stamps"`` of a tuning file holding ``priorities`` (JSON entries) measured
    on ``device_type``: one per op."""
    return {
        op: op_stamp(op, _providers_in(entry, op), device_type) for op, entry in priorities.items()
    }


PROVING_FIELDS = ("device", "torch", "triton", "vllm_ir")
"""The environment fields every stamp has (since format 2): one without them proves nothing."""


def stamp_difference(stamp: Mapping[str, Any], listed: Iterable[str] = ()) -> str | None:
    """How this process differs from where ``stamp`` was measured, in words, or None.

    A stamp must prove where it was measured: its environment names each of
    :data:`PROVING_FIELDS`, and its ``impls`` each provider the entry lists
    (``listed``); otherwise the difference says which field is missing. Other
    fields a stamp lacks (``threads``: not on a GPU) are not compared; an impl
    not registered here is not either (selection skips it); code that cannot be
    fingerprinted, on either side, is compared by its package alone.
    """
    then = stamp.get("environment")
    if not isinstance(then, Mapping):
        return "the stamp has no environment"
    # {} or unknown keys only would otherwise pass every comparison below
    missing = [key for key in PROVING_FIELDS if key not in then]
    if missing:
        return f"the stamp's environment has no {', '.join(missing)}"
    impls = stamp.get("impls")
    if not isinstance(impls, Mapping):
        return "the stamp has no impls"
    unstamped = [p for p in dict.fromkeys(listed) if not isinstance(impls.get(p), Mapping)]
    if unstamped:  # stamps_of stamps every provider an entry lists
        return f"the stamp's impls have no {', '.join(unstamped)}"
    device_type = str(then.get("type") or str(then.get("device", "cpu")).split(":", 1)[0])
    if device_type not in ("cpu", "cuda", "xpu"):
        device_type = "cuda"  # a GPU's name (a stamp without its type): this machine's GPU
    now = environment(torch.device(device_type))
    for key, value in then.items():
        if key in now and str(value) != now[key]:
            return f"{key} {value}, here {now[key]}"
    op = IrOp.registry.get(str(stamp.get("op", "")))
    if op is None:
        return None
    for provider, recorded in impls.items():
        if provider not in op.impls or not isinstance(recorded, Mapping):
            continue
        here = _impl_stamp(op, provider)
        if recorded.get("package") != here["package"]:
            return f"impl {provider}: {recorded.get('package')}, here {here['package']}"
        code = recorded.get("code")
        if code is not None and here["code"] is not None and code != here["code"]:
            return f"impl {provider}: its code changed"
    return None


def _listed(entry: object, op_name: str) -> tuple[str, ...]:
    """The providers ``entry`` lists; none if malformed (the entry is refused later)."""
    try:
        return _providers_in(entry, op_name)
    except (ValueError, TypeError):
        return ()


UNCHECKED = {"format": 1}
"""The stamp of an entry a write kept from a format-1 file (which has no stamps):
applied unchecked, as that file was, instead of refused as unstamped."""


def drop_stale(
    priorities: Mapping[str, Any], stamps: object, where: str, accept_stale: bool
) -> dict[str, Any]:
    """``priorities`` without the entries whose stamp differs from this process (or
    is missing or malformed), each skipped one with a warning line; all of them
    if ``accept_stale`` (each still named, as applied)."""
    kept = {}
    for op_name, entry in priorities.items():
        stamp = stamps.get(op_name) if isinstance(stamps, Mapping) else None
        if stamp == UNCHECKED:
            kept[op_name] = entry
            continue
        if isinstance(stamp, Mapping):
            difference = stamp_difference({**stamp, "op": op_name}, _listed(entry, op_name))
        else:
            difference = "the file has no stamp for it"
        if difference is None:
            kept[op_name] = entry
            continue
        # a stamp missing a field is no evidence of anywhere: say so, not "elsewhere"
        why = (
            "its stamp proves nothing"
            if difference.startswith("the stamp")
            else "measured elsewhere"
        )
        if accept_stale:
            logger.warning(
                "%s: %s %s (%s); applied (accept stale)", where, op_name, why, difference
            )
            kept[op_name] = entry
        else:
            threads = f" with --threads {torch.get_num_threads()}"
            logger.warning(
                "%s: %s not applied: %s (%s); tune again here%s, or set "
                "VLLM_IR_ACCEPT_STALE=1 to apply it",
                where,
                op_name,
                why,
                difference,
                threads if difference.startswith("threads") else "",
            )
    return kept
