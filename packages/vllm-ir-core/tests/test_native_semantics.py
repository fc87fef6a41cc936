"""The native functions are the semantics: check them against first principles."""

from __future__ import annotations

import re

import pytest
import torch
import torch.utils._pytree as pytree
import vllm_ir as ir
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from vllm_ir.ops.quant import FP8_MAX

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, vs: int | None):
    x32 = x.double()
    var_src = x32 if vs is None else x32[..., :vs]
    rms = torch.sqrt(var_src.pow(2).mean(-1, keepdim=True) + eps)
    out = (x32 / rms).to(x.dtype)
    return out if weight is None else out * weight


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_matches_reference(dtype: torch.dtype) -> None:
    op = ir.ops.rms_norm
    for sample in op.sample_inputs(dtype):
        tol = op.tolerance(dtype)
        got = op(*sample.args)
        want = reference_rms_norm(*sample.args, *(() if len(sample.args) == 4 else (None,)))
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol, msg=sample.name)


def test_rms_norm_computes_in_fp32() -> None:
    # values whose squares overflow fp16 still normalize correctly
    x = torch.full((2, 8), 300.0, dtype=torch.float16)
    out = ir.ops.rms_norm(x, None, 1e-6)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.ones_like(out))


def test_rms_norm_variance_size_uses_leading_channels() -> None:
    x = torch.tensor([[1.0, 1.0, 100.0, 100.0]])
    out = ir.ops.rms_norm(x, None, 0.0, 2)
    torch.testing.assert_close(out, x)  # rms of the first two channels is 1


def test_weight_promotes_dtype() -> None:
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    w = torch.ones(16, dtype=torch.float32)
    assert ir.ops.rms_norm(x, w, 1e-6).dtype == torch.float32
    assert ir.ops.rms_norm(x, None, 1e-6).dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_add_rms_norm_is_add_then_norm(dtype: torch.dtype) -> None:
    op = ir.ops.fused_add_rms_norm
    for sample in op.sample_inputs(dtype):
        x, residual, weight, eps, *rest = sample.args
        out, new_residual = op(*sample.args)
        summed = x + residual
        torch.testing.assert_close(new_residual, summed, atol=0, rtol=0)
        want = ir.ops.rms_norm(summed, weight, eps, *rest)
        torch.testing.assert_close(out, want, atol=0, rtol=0, msg=sample.name)


def test_sample_inputs_cover_the_documented_cases() -> None:
    names = [s.name for s in ir.ops.rms_norm.sample_inputs()]
    assert {"1x64", "2x3x128", "4x64-no-weight", "4x96-variance64", "4x128-strided-rows"} <= set(
        names
    )
    strided = next(s for s in ir.ops.rms_norm.sample_inputs() if "strided" in s.name)
    assert not strided.args[0].is_contiguous()


def test_tolerances_defined_per_dtype() -> None:
    assert (
        ir.ops.rms_norm.tolerance(torch.float32).atol
        < ir.ops.rms_norm.tolerance(torch.bfloat16).atol
    )
    with pytest.raises(KeyError, match=r"no tolerance defined for torch\.int8"):
        ir.ops.rms_norm.tolerance(torch.int8)


# -- gated activations: an odd width is one error, from native and every impl ----------

GATED = ["silu_and_mul", "gelu_and_mul"]


def _odd_width_message(name: str, width: int) -> str:
    return "^" + re.escape(
        f"{name}: x's last dimension ({width}) must be even: "
        "it holds the gate and the up projection"
    )


@pytest.mark.parametrize("width", [1, 3, 7, 4095])
@pytest.mark.parametrize("name", GATED)
def test_an_odd_width_is_one_error_from_native_and_every_impl(name: str, width: int) -> None:
    """Native used to broadcast widths 1 and 3 and fail on the others with torch's
    size mismatch; every registered impl (whatever this machine supports: the check
    comes before any kernel) raises the op's own ValueError, as does dispatch."""
    op = ir.get_op(name)
    x = torch.randn(2, width)
    message = _odd_width_message(name, width)
    with pytest.raises(ValueError, match=message):
        op.native(x)
    with pytest.raises(ValueError, match=message):
        op(x)
    for impl in op.impls.values():
        with pytest.raises(ValueError, match=message):
            impl.impl_fn(x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", GATED)
def test_gated_samples_have_even_widths(name: str, dtype: torch.dtype) -> None:
    """The conformance kit and opcheck run the op's samples: an odd width is an error,
    never a sample."""
    samples = list(ir.get_op(name).sample_inputs(dtype))
    assert samples
    for sample in samples:
        assert sample.args[0].shape[-1] % 2 == 0, sample.name


# -- dynamic_per_token_fp8_quant: scale_ub on another device -----------------------------

DYNAMIC = ir.ops.dynamic_per_token_fp8_quant


class _MixedDevices(TorchDispatchMode):
    """Records each op called with tensors on more than one device."""

    def __init__(self) -> None:
        super().__init__()
        self.mixed: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if len({t.device for t in tensors}) > 1:
            self.mixed.append(str(func))
        return func(*args, **kwargs)


@pytest.mark.parametrize("shape", [(), (1,)], ids=["0-d", "1"])
def test_dynamic_quant_moves_a_cpu_scale_ub_to_xs_device(shape: tuple[int, ...]) -> None:
    """With ``x`` on CUDA (FakeTensors: no GPU needed) and ``scale_ub`` on the CPU, no op
    sees two devices: ``clamp`` takes no bound on another device, not even a 0-d CPU one
    (the H200 run: "max is on cpu"). Fails on the old ``amax.clamp(max=scale_ub)``."""
    with FakeTensorMode(), _MixedDevices() as record:
        x = torch.empty(4, 64, device="cuda", dtype=torch.bfloat16)
        q, scales = DYNAMIC.native(x, torch.full(shape, 0.5))
    assert record.mixed == []
    assert q.device.type == scales.device.type == "cuda"
    assert scales.shape == (4, 1)
    assert scales.dtype == torch.float32


_UBS = {
    "0-d": torch.tensor(0.5),
    "1": torch.tensor([0.5]),
    "0-d-float64": torch.tensor(0.5, dtype=torch.float64),
    "nan": torch.tensor(float("nan")),
    "1-nan": torch.tensor([float("nan")]),
}


@pytest.mark.parametrize("ub", list(_UBS), ids=str)
@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        ),
    ],
)
def test_dynamic_quant_scale_ub_is_clamps_bound(device: str, ub: str) -> None:
    """``scale_ub`` of shape () or (1,), any float dtype, on the CPU with ``x`` anywhere:
    each row's amax clamped to it, and a NaN bound makes every scale NaN (``clamp``'s
    rule for a tensor bound), the same as ``scale_ub`` on ``x``'s device."""
    gen = torch.Generator().manual_seed(0)
    rows = torch.tensor([0.1, 1, 10, 100, 1000, 0])[:, None]  # amax below and above 0.5
    x = (torch.randn(6, 64, generator=gen) * rows).to(device)
    q, scales = DYNAMIC.native(x, _UBS[ub])
    bound = float(_UBS[ub])
    amax = x.abs().amax(-1, keepdim=True).float()  # on x's device: its division's rounding
    # clamp with a tensor bound: NaN in, NaN out (a Python-float NaN bound is ignored)
    amax = torch.full_like(amax, bound) if bound != bound else amax.clamp(max=bound)
    want = (amax / FP8_MAX).clamp(min=1 / (FP8_MAX * 512))
    assert scales.device == x.device
    assert scales.dtype == torch.float32
    torch.testing.assert_close(scales, want, rtol=0, atol=0, equal_nan=True)
    same_device = DYNAMIC.native(x, _UBS[ub].to(device))
    assert torch.equal(q.view(torch.uint8), same_device[0].view(torch.uint8))
    torch.testing.assert_close(scales, same_device[1], rtol=0, atol=0, equal_nan=True)
