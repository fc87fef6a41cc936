"""Parsing the arguments shared by the commands, and building op call arguments."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import types
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from vllm_ir_cli.commands import UsageError

from vllm_ir._op.op import IrOp, get_op

__all__ = [
    "DTYPES",
    "UsageError",
    "allocating",
    "apply_threads",
    "call_args_for",
    "checked_call",
    "check_fits",
    "check_native_accepts",
    "parse_device",
    "parse_dtype",
    "parse_op",
    "parse_shape",
    "writable_file",
    "write_atomically",
]

DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}


def parse_op(name: str) -> IrOp:
    try:
        return get_op(name)
    except KeyError as e:
        raise UsageError(e.args[0]) from None


def parse_dtype(text: str) -> torch.dtype:
    try:
        return DTYPES[text.strip().lower()]
    except KeyError:
        raise UsageError(
            f"unknown dtype {text!r}; use one of {', '.join(sorted(set(DTYPES)))}"
        ) from None


def parse_shape(text: str) -> tuple[int, ...]:
    """``"8,4096"`` or ``"8x4096"`` -> ``(8, 4096)``."""
    parts = text.replace("x", ",").split(",")
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(f"malformed shape {text!r}; expected e.g. 8,4096 or 8x4096") from None
    if not shape or any(d <= 0 for d in shape):
        raise UsageError(f"malformed shape {text!r}: every dimension must be positive")
    return shape


def parse_assignments(items: Sequence[str]) -> dict[str, Any]:
    """``["variance_size=64"]`` -> ``{"variance_size": 64}`` (Python literals)."""
    import ast

    values = {}
    for item in items:
        name, eq, raw = item.partition("=")
        if not eq or not name:
            raise UsageError(f"--arg expects NAME=VALUE, got {item!r}")
        try:
            values[name] = ast.literal_eval(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            # MemoryError / RecursionError: nested too deeply for the parser
            shown = raw if len(raw) <= 40 else f"{raw[:40]}... ({len(raw)} characters)"
            raise UsageError(f"--arg {name}: {shown!r} is not a Python literal") from None
    return values


def _memory_bytes(device: torch.device) -> int | None:
    """The memory of ``device`` (``None``: unknown, nothing is checked up front)."""
    try:
        if device.type == "cpu":
            return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        if device.type == "cuda":
            return int(torch.cuda.mem_get_info(device)[1])
    except (ValueError, OSError, RuntimeError, AttributeError):
        pass
    return None


def check_fits(what: str, numel: int, dtype: torch.dtype, device: str, fix: str) -> None:
    """A usage error if ``numel`` elements of ``dtype`` exceed the device's memory."""
    needed = numel * torch.empty((), dtype=dtype).element_size()
    available = _memory_bytes(torch.device(device))
    if needed >= 2**63 or (available is not None and needed > available):
        have = f"the {available / 2**30:.1f} GiB" if available is not None else "the memory"
        raise UsageError(
            f"{what} would take {needed / 2**30:,.1f} GiB, more than {have} of {device}; {fix}"
        )


@contextlib.contextmanager
def allocating(what: str, fix: str) -> Iterator[None]:
    """Allocation failures (out of memory, sizes that overflow) as one usage error."""
    try:
        yield
    except (RuntimeError, MemoryError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        if isinstance(e, MemoryError) or any(
            word in first for word in ("alloc", "out of memory", "overflow")
        ):
            raise UsageError(f"cannot allocate {what}: {first[:200]}; {fix}") from None
        raise


def call_args_for(
    op: IrOp,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: str,
    overrides: dict[str, Any] | None = None,
) -> tuple[Any, ...]:
    """Arguments for one call of ``op``: activations of ``shape``, other tensors
    shaped like in the op's first sample input but with ``shape``'s last dim,
    non-tensor arguments from the sample (``overrides`` by name win)."""
    sample = next(op.sample_inputs(dtype, device))
    names = list(op.signature.parameters)
    overrides = dict(overrides or {})
    unknown = [n for n in overrides if n not in names]
    if unknown:
        raise UsageError(
            f"{op.name} has no parameter {unknown[0]!r}; parameters: {', '.join(names)}"
        )
    for name, value in overrides.items():
        _check_arg_type(op, name, value)
    values: list[Any] = []
    shapes: dict[int, tuple[int, ...]] = {}
    for i, name in enumerate(names):
        if name in overrides:
            values.append(overrides[name])
            continue
        value = sample.args[i] if i < len(sample.args) else op.signature.parameters[name].default
        if isinstance(value, torch.Tensor):
            shapes[i] = shape if name in op.activations else (*value.shape[:-1], shape[-1])
        values.append(value)
    what = f"{op.name}'s arguments for shape {'x'.join(map(str, shape))}"
    fix = "give a smaller shape"
    check_fits(what, sum(math.prod(s) for s in shapes.values()), dtype, device, fix)
    with allocating(what, fix):
        for i, tensor_shape in shapes.items():
            values[i] = torch.randn(*tensor_shape, dtype=dtype, device=device)
    return tuple(values)


def parse_device(text: str) -> str:
    """A device this torch can allocate on: ``cpu``, ``cuda``, ``cuda:1`` ..."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise UsageError(f"unknown device {text!r}; use e.g. cpu or cuda") from None
    if device.type != "cpu":
        backend = getattr(torch, device.type, None)
        available = getattr(backend, "is_available", None)
        if available is None or not available():
            raise UsageError(
                f"--device {text}: torch {torch.__version__} has no usable {device.type} "
                f"device here; use --device cpu, or VLLM_IR_PLATFORM={device.type} to see "
                f"the {device.type} defaults on this machine"
            )
    return text


def _hint_text(op: IrOp, name: str) -> str:
    annotation = op.signature.parameters[name].annotation
    if isinstance(annotation, str):
        return annotation
    return getattr(annotation, "__name__", str(annotation))


def _matches(value: Any, hint: Any) -> bool:
    """Whether a literal from the command line fits an annotation (unknown ones fit)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_matches(value, h) for h in typing.get_args(hint))
    if hint is type(None) or hint is None:
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is torch.Tensor:
        return False  # tensors come from --shape / --dtype, never from --arg
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _check_arg_type(op: IrOp, name: str, value: Any) -> None:
    try:
        hint = typing.get_type_hints(op.native).get(name, Any)
    except Exception:  # an annotation that does not evaluate: nothing to check against
        return
    if hint is Any or _matches(value, hint):
        return
    alternatives = typing.get_args(hint) or (hint,)
    if torch.Tensor in alternatives:
        none_ok = f" ({name}=None is accepted)" if type(None) in alternatives else ""
        raise UsageError(
            f"--arg {name}={value!r}: {name} is a tensor argument of {op.name}{none_ok}; "
            "tensors are built from --shape and --dtype"
        )
    raise UsageError(
        f"--arg {name}={value!r}: {type(value).__name__} does not fit {op.name}'s "
        f"{name} ({_hint_text(op, name)}); give a literal of that type"
    )


def check_native_accepts(op: IrOp, call: tuple[Any, ...], shape: tuple[int, ...]) -> None:
    """Run the native function once, so that arguments the op cannot take are a usage error."""
    try:
        with torch.inference_mode():
            op.native(*call)
    except (RuntimeError, ValueError, IndexError, TypeError) as e:
        samples = ", ".join(
            "x".join(map(str, s.args[0].shape))
            for s in op.sample_inputs(torch.float32, "cpu")
            if isinstance(s.args[0], torch.Tensor)
        )
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UsageError(
            f"{op.name} cannot take shape {'x'.join(map(str, shape))}: {first}; "
            f"shapes it takes include {samples}"
        ) from None


def checked_call(
    op: IrOp,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: str,
    assignments: Sequence[str] = (),
) -> tuple[Any, ...]:
    """:func:`call_args_for` with ``--arg NAME=VALUE`` ``assignments``, checked by
    running the native function once (:func:`check_native_accepts`).

    Selection only asks ``supports_args``, which need not check what the op
    itself requires (``silu_and_mul``'s even width): without the check a
    command would show or time impls for a call that every impl raises on.
    """
    call = call_args_for(op, shape, dtype, device, parse_assignments(assignments))
    check_native_accepts(op, call, shape)
    return call


_TORCH_DEFAULT_THREADS: list[int] = []
"""torch's own thread count, kept when the command line sets another before the command runs."""


def set_threads_early(threads: int) -> None:
    """``--threads``, set before the selection flags are read (a tuning file's stamps
    are checked against the thread count); :func:`apply_threads` reports it."""
    if threads > 0:
        _TORCH_DEFAULT_THREADS.append(torch.get_num_threads())
        torch.set_num_threads(threads)


def apply_threads(threads: int) -> str:
    """Set torch's intra-op threads (``0``: keep torch's choice); returns a line saying so.

    Timings on a shared machine swing by orders of magnitude when every core
    is asked for; one thread gives steady figures, more threads show scaling.
    """
    default = _TORCH_DEFAULT_THREADS[0] if _TORCH_DEFAULT_THREADS else torch.get_num_threads()
    if threads > 0:
        torch.set_num_threads(threads)
    chosen = torch.get_num_threads()
    origin = "torch's default" if threads == 0 else "--threads"
    return (
        f"threads: {chosen} ({origin}; torch's default here is {default}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})"
    )


def writable_file(option: str, path: str) -> Path:
    """``path`` for ``option``, checked before any work: its directory exists and
    takes new files, and ``path`` is not a directory."""
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise UsageError(f"{option} {path}: is a directory; give a file name")
    if not parent.is_dir():
        raise UsageError(
            f"{option} {path}: directory {str(parent)!r} does not exist; create it first"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: directory {str(parent)!r} is not writable")
    return target


def write_atomically(option: str, target: Path, text: str, *, mode: int = 0o666) -> None:
    """Write ``text`` to ``target`` through a temporary file beside it, then rename:
    a reader never sees half a file, and a failure leaves nothing behind. ``mode``
    (less the umask): the file's permissions."""
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as e:
        raise UsageError(f"{option} {target}: cannot write: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode & ~_umask())  # mkstemp makes 0600; an output file is not secret
        os.replace(tmp, target)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise UsageError(f"{option} {target}: cannot write: {e.strerror}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
