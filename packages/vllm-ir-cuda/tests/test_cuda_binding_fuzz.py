"""Bad arguments to every ``torch.ops.vllm_ir_cuda`` binding raise one line, never crash.

Each trial takes a valid call of one op and spoils one or two of its tensor
arguments at random (dtype, device, shape, layout, aliasing, zero or huge
sizes, misalignment). The call must then either raise a one-line
``RuntimeError`` or run; after every call the device must still be healthy
(``torch.cuda.synchronize()``: a kernel that read or wrote out of bounds shows
there). Misaligned copies of valid arguments must run and match the aligned call.

Runs on a CUDA GPU only (the binding's CUDA kernels); seeded, so a failure names
a trial that reproduces.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch
from cuda_stand_ins import requires_cuda
from vllm_ir_cuda import _build, ops

pytestmark = requires_cuda

DEVICE = "cuda"
TRIALS = 150

Args = list[object]


@pytest.fixture(scope="module", autouse=True)
def kernels() -> None:
    _build.load()


def _valid(name: str, rng: random.Random) -> Args:
    """A valid call of ``name``: a few rows of a random width, a random dtype."""
    dtype = rng.choice(ops.DTYPES)
    rows, hidden = rng.choice([1, 3, 8]), rng.choice([16, 64, 96, 256])

    def t(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape, device=DEVICE).to(dt)

    fp8 = torch.float8_e4m3fn
    scale = torch.tensor([0.05], device=DEVICE)
    return {
        "rms_norm": lambda: [t(rows, hidden), t(rows, hidden), t(hidden), 1e-6],
        "fused_add_rms_norm": lambda: [t(rows, hidden), t(rows, hidden), t(hidden), 1e-6],
        "silu_and_mul": lambda: [t(rows, hidden), t(rows, 2 * hidden)],
        "gelu_and_mul": lambda: [t(rows, hidden), t(rows, 2 * hidden), "tanh"],
        "rotary_embedding": lambda: [
            t(rows, 4, 64),
            t(rows, 2, 64),
            t(rows, 64),
            t(rows, 64),
            rng.random() < 0.5,
        ],
        "static_scaled_fp8_quant": lambda: [t(rows, hidden, dt=fp8), t(rows, hidden), scale],
        "dynamic_per_token_fp8_quant": lambda: [
            t(rows, hidden, dt=fp8),
            t(rows, 1, dt=torch.float32),
            t(rows, hidden),
            None,
        ],
        "rms_norm_static_fp8_quant": lambda: [
            t(rows, hidden, dt=fp8),
            t(rows, hidden),
            t(hidden),
            1e-6,
            scale,
        ],
        "fused_add_rms_norm_static_fp8_quant": lambda: [
            t(rows, hidden, dt=fp8),
            t(rows, hidden),
            t(rows, hidden),
            t(hidden),
            1e-6,
            scale,
        ],
    }[name]()


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` whose storage starts one element past a 16-byte boundary."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:]
    return flat.view(t.shape).copy_(t)


Spoil = Callable[[torch.Tensor, Args, random.Random], torch.Tensor]


def _other_tensor(t: torch.Tensor, args: Args, rng: random.Random) -> torch.Tensor:
    others = [a for a in args if isinstance(a, torch.Tensor) and a is not t]
    return rng.choice(others) if others else t


SPOILS: dict[str, Spoil] = {
    "dtype": lambda t, a, r: t.to(
        r.choice([torch.float64, torch.int32, torch.float16, torch.bfloat16, torch.float32])
    ),
    "cpu": lambda t, a, r: t.cpu(),
    "narrower": lambda t, a, r: t[..., : max(t.shape[-1] - 1, 0)] if t.dim() else t,
    "extra_dim": lambda t, a, r: t.unsqueeze(0),
    "flat": lambda t, a, r: t.reshape(-1),
    "scalar": lambda t, a, r: t.flatten()[0] if t.numel() else t,
    "empty": lambda t, a, r: t[:0] if t.dim() else t,
    "transposed": lambda t, a, r: t.transpose(0, -1) if t.dim() >= 2 else t,
    "strided": lambda t, a, r: t.repeat_interleave(2, -1)[..., ::2] if t.dim() else t,
    "stride_0": lambda t, a, r: t.flatten()[:1].expand(t.shape) if t.dim() and t.numel() else t,
    "alias": _other_tensor,
    "huge_rows": lambda t, a, r: t.flatten()[:1].expand(2**31, 1) if t.numel() else t,
    "huge_hidden": lambda t, a, r: t.flatten()[:1].expand(1, 2**31) if t.numel() else t,
}


def _call(name: str, args: Args) -> None:
    getattr(ops, name)(*args)


def _error_of(name: str, args: Args) -> str | None:
    """The RuntimeError's message the call raised, or None if it ran."""
    try:
        _call(name, args)
    except RuntimeError as e:
        return str(e)
    return None


@pytest.mark.parametrize("name", list(ops.SCHEMAS))
def test_spoiled_arguments_raise_one_line_or_run(name: str) -> None:
    rng = random.Random(name)
    outcomes: dict[str, int] = {"raised": 0, "ran": 0}
    for trial in range(TRIALS):
        args = _valid(name, rng)
        spoiled = []
        for _ in range(rng.choice([1, 1, 2])):
            positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
            i = rng.choice(positions)
            kind = rng.choice(list(SPOILS))
            args[i] = SPOILS[kind](args[i], args, rng)  # type: ignore[arg-type]
            spoiled.append(f"{kind}@{i}")
        where = f"{name} trial {trial} ({', '.join(spoiled)})"
        message = _error_of(name, args)
        if message is None:
            outcomes["ran"] += 1
        else:
            lines = message.strip().splitlines()
            assert len(lines) == 1, f"{where}: a message of {len(lines)} lines: {message}"
            outcomes["raised"] += 1
        torch.cuda.synchronize()  # raises if a kernel touched memory it must not
    assert outcomes["raised"] > TRIALS // 3, outcomes


def _clone(args: Args) -> Args:
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def _assert_same(got: Args, want: Args, where: str) -> None:
    for g, w in zip(got, want, strict=True):
        if isinstance(g, torch.Tensor):
            assert isinstance(w, torch.Tensor)
            # the scalar path sums a row in another order than the 128-bit one: an ulp
            # of the dtype, one FP8 step
            torch.testing.assert_close(
                g.float(), w.float(), rtol=0.13, atol=2e-2, msg=lambda m: f"{where}: {m}"
            )


@pytest.mark.parametrize("name", list(ops.SCHEMAS))
def test_misaligned_arguments_run_and_match(name: str) -> None:
    rng = random.Random(f"{name}-misaligned")
    for trial in range(20):
        args = _valid(name, rng)
        positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        moved = rng.sample(positions, rng.randint(1, len(positions)))
        shifted = _clone(args)
        for i in moved:
            shifted[i] = _misaligned(shifted[i])  # type: ignore[arg-type]
        want = _clone(args)
        _call(name, want)
        _call(name, shifted)
        torch.cuda.synchronize()
        _assert_same(shifted, want, f"{name} trial {trial} (misaligned {moved})")
