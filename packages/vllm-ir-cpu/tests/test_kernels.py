"""The kernel ops ``torch.ops.vllm_ir_cpu.*`` on their own: opcheck, layouts, errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import vllm_ir as ir
from cpu_c_testing import DTYPES, run_python
from vllm_ir_cpu import library
from vllm_ir_cpu.library import SCHEMAS, kernel_ops

OPS = kernel_ops()
EPS = 1e-6


def _rms_samples(dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor | None, float]]:
    return [s.args[:3] for s in ir.ops.rms_norm.sample_inputs(dtype) if len(s.args) == 3]


def _fused_samples(
    dtype: torch.dtype,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, float]]:
    return [s.args for s in ir.ops.fused_add_rms_norm.sample_inputs(dtype) if len(s.args) == 4]


def _written(name: str) -> list[str]:
    return [a.name for a in OPS[name]._schema.arguments if a.alias_info and a.alias_info.is_write]


def test_schemas_declare_what_is_written() -> None:
    assert _written("rms_norm") == ["out"]
    assert _written("fused_add_rms_norm") == ["x", "x_residual"]
    # the quantized fused-add op writes the residual only; x is read
    assert _written("fused_add_rms_norm_static_fp8_quant") == ["x_residual"]
    for name in (
        "rms_norm_functional",
        "silu_and_mul",
        "static_scaled_fp8_quant",
        "dynamic_per_token_fp8_quant",
        "rms_norm_static_fp8_quant",
    ):
        assert _written(name) == [], name
    assert set(SCHEMAS) == set(OPS)


def _quant_samples(dtype: torch.dtype) -> list[tuple[torch._ops.OpOverload, tuple[Any, ...]]]:
    calls: list[tuple[torch._ops.OpOverload, tuple[Any, ...]]] = []
    for op in (
        ir.ops.silu_and_mul,
        ir.ops.static_scaled_fp8_quant,
        ir.ops.rms_norm_static_fp8_quant,
        ir.ops.fused_add_rms_norm_static_fp8_quant,
    ):
        calls += [(OPS[op.name], s.args) for s in op.sample_inputs(dtype)]
    for s in ir.ops.dynamic_per_token_fp8_quant.sample_inputs(dtype):
        args = s.args if len(s.args) == 2 else (*s.args, None)
        calls.append((OPS["dynamic_per_token_fp8_quant"], args))
    return calls


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck_silu_and_quant(kernels: Path, dtype: torch.dtype) -> None:
    for kernel, args in _quant_samples(dtype):
        torch.library.opcheck(kernel, args)


def test_quant_kernels_trace_on_meta_without_the_library() -> None:
    x, s = torch.empty(3, 64, device="meta"), torch.empty(1, device="meta")
    assert OPS["silu_and_mul"](x).shape == (3, 32)
    assert OPS["static_scaled_fp8_quant"](x, s).dtype == torch.float8_e4m3fn
    q, scales = OPS["dynamic_per_token_fp8_quant"](x, None)
    assert (q.dtype, scales.shape, scales.dtype) == (torch.float8_e4m3fn, (3, 1), torch.float32)
    assert OPS["rms_norm_static_fp8_quant"](x, None, EPS, s).shape == (3, 64)
    q = OPS["fused_add_rms_norm_static_fp8_quant"](x, torch.empty_like(x), None, EPS, s)
    assert (q.shape, q.dtype, q.device.type) == ((3, 64), torch.float8_e4m3fn, "meta")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck(kernels: Path, dtype: torch.dtype) -> None:
    for x, w, eps in _rms_samples(dtype):
        torch.library.opcheck(OPS["rms_norm_functional"], (x, w, eps))
        torch.library.opcheck(OPS["rms_norm"], (torch.empty_like(x), x, w, eps))
    for x, r, w, eps in _fused_samples(dtype):
        torch.library.opcheck(OPS["fused_add_rms_norm"], (x.clone(), r.clone(), w, eps))


def _on_exact_grid(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A copy of ``t`` (layout kept) holding values k/8, |k| <= 32.

    Their squares are multiples of 1/64, so below 4096 elements a row (sums of
    two such values included) every partial sum of squares is exact in fp32: the
    variance is the same whatever order ATen sums in (that order changes with the
    CPU's vector width and the torch release), and only the rounding points the
    kernels share with native remain to compare.
    """
    assert t.shape[-1] < 4096, t.shape
    grid = torch.randint(-32, 33, t.shape, generator=gen).to(torch.float32) / 8
    return t.clone().copy_(grid)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bf16_fp16_bit_exact_fp32_within_tolerance(kernels: Path, dtype: torch.dtype) -> None:
    """The kernels round where native rounds: 16-bit results are bit-identical
    wherever the sum of squares is exact; elsewhere only fp32's summation order
    differs, within the op's tolerance."""
    tol = ir.ops.rms_norm.tolerance(dtype)
    half = dtype != torch.float32
    gen = torch.Generator().manual_seed(11)
    for sample, w, eps in _rms_samples(dtype):
        for x, exact in ((sample, False), (_on_exact_grid(sample, gen), half)):
            want = ir.ops.rms_norm.native(x, w, eps)
            got = OPS["rms_norm_functional"](x, w, eps)
            if exact:
                assert torch.equal(got, want)
            torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)
    for sample_x, sample_r, w, eps in _fused_samples(dtype):
        grid = (_on_exact_grid(sample_x, gen), _on_exact_grid(sample_r, gen))
        for (x, r), exact in (((sample_x, sample_r), False), (grid, half)):
            want_h, want_r = ir.ops.fused_add_rms_norm.native(x, r, w, eps)
            got_h, got_r = x.clone(), r.clone()
            OPS["fused_add_rms_norm"](got_h, got_r, w, eps)
            assert torch.equal(got_r, want_r)  # the rounded sum, exactly
            if exact:
                assert torch.equal(got_h, want_h)
            torch.testing.assert_close(got_h, want_h, atol=tol.atol, rtol=tol.rtol)


def test_vllm_fused_add_rms_norm_normalizes_the_fp32_sum(kernels: Path) -> None:
    """vLLM's numerics, bit for bit: x on a grid of 1/8, residuals of a few 1/1024 make
    sums bf16 rounds, but whose squares still sum exactly in fp32 (64 channels,
    |sum| < 2**-1 + 2**-8). The seed op's rounded sum gives other outputs. (fp16
    keeps such sums; its results are checked within tolerance by the conformance
    tests.)"""
    dtype = torch.bfloat16
    gen = torch.Generator().manual_seed(5)
    x = (torch.randint(-4, 5, (16, 64), generator=gen) / 8).to(dtype)
    r = (torch.randint(-3, 4, (16, 64), generator=gen) / 1024).to(dtype)
    w = (torch.randint(1, 9, (64,), generator=gen) / 4).to(dtype)
    want_h, want_r = ir.ops.vllm_fused_add_rms_norm.native(x, r, w, EPS)
    seed_h, seed_r = ir.ops.fused_add_rms_norm.native(x, r, w, EPS)
    assert torch.equal(want_r, seed_r)
    assert not torch.equal(want_h, seed_h)  # the test can tell
    got_h, got_r = x.clone(), r.clone()
    OPS["vllm_fused_add_rms_norm"](got_h, got_r, w, EPS)
    assert torch.equal(got_r, want_r)
    assert torch.equal(got_h, want_h)
    torch.library.opcheck(OPS["vllm_fused_add_rms_norm"], (x.clone(), r.clone(), w, EPS))


def _layouts(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    return {
        "strided-rows": randn(6, 160)[:, 16:144],
        "3d-strided-rows": randn(2, 3, 200)[..., :128],
        # leading dims that do not collapse into one row stride
        "3d-transposed-leading": randn(3, 2, 128).transpose(0, 1),
        # last dim not contiguous
        "transposed": randn(128, 5).t(),
        "one-row": randn(1, 128),
        "1d": randn(77),
        "hidden-below-vector-width": randn(5, 3),
        "odd-hidden": randn(9, 1001),
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_any_layout_out_of_place(kernels: Path, dtype: torch.dtype) -> None:
    tol = ir.ops.rms_norm.tolerance(dtype)
    for name, x in _layouts(dtype).items():
        w = torch.linspace(0.5, 1.5, x.shape[-1]).to(dtype)
        want = ir.ops.rms_norm.native(x, w, EPS)
        got = OPS["rms_norm_functional"](x, w, EPS)
        assert got.is_contiguous(), name
        torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol, msg=name)
        # the out variant writes into an out of any layout too
        out = torch.empty_like(x.transpose(0, -1)).transpose(0, -1) if x.ndim > 1 else x * 0
        OPS["rms_norm"](out, x, w, EPS)
        torch.testing.assert_close(out, want, atol=tol.atol, rtol=tol.rtol, msg=name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_any_layout_in_place(kernels: Path, dtype: torch.dtype) -> None:
    tol = ir.ops.rms_norm.tolerance(dtype)
    for name, x in _layouts(dtype).items():
        r = torch.rand_like(x)
        w = torch.linspace(0.5, 1.5, x.shape[-1]).to(dtype)
        want_h, want_r = ir.ops.fused_add_rms_norm.native(x, r, w, EPS)
        x_ptr, r_ptr = x.data_ptr(), r.data_ptr()
        OPS["fused_add_rms_norm"](x, r, w, EPS)
        assert (x.data_ptr(), r.data_ptr()) == (x_ptr, r_ptr)
        torch.testing.assert_close(r, want_r, atol=tol.atol, rtol=tol.rtol, msg=name)
        torch.testing.assert_close(x, want_h, atol=tol.atol, rtol=tol.rtol, msg=name)


def test_rms_norm_into_its_input(kernels: Path) -> None:
    x = torch.randn(4, 96)
    want = ir.ops.rms_norm.native(x, None, EPS)
    OPS["rms_norm"](x, x, None, EPS)
    torch.testing.assert_close(x, want)


def test_no_rows(kernels: Path) -> None:
    x = torch.empty(0, 64)
    assert OPS["rms_norm_functional"](x, torch.ones(64), EPS).shape == (0, 64)
    OPS["fused_add_rms_norm"](x, torch.empty(0, 64), None, EPS)


def test_many_rows_run_in_parallel_and_match(kernels: Path) -> None:
    # well above the kernels' threshold for waking the OpenMP team
    x, w = torch.randn(300, 512), torch.rand(512)
    torch.testing.assert_close(
        OPS["rms_norm_functional"](x, w, EPS), ir.ops.rms_norm.native(x, w, EPS)
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: OPS["rms_norm_functional"](torch.randn(2, 8, dtype=torch.float64), None, EPS),
            "supports float32, bfloat16 and float16, got Double",
        ),
        (
            lambda: OPS["rms_norm_functional"](torch.randn(2, 8), torch.ones(8).half(), EPS),
            "weight has dtype Half but x has Float",
        ),
        (
            lambda: OPS["rms_norm_functional"](torch.randn(2, 8), torch.ones(7), EPS),
            r"weight must have shape \(8,\), got \[7\]",
        ),
        (
            lambda: OPS["rms_norm"](torch.empty(2, 9), torch.randn(2, 8), None, EPS),
            r"out has shape \[2, 9\] but x has \[2, 8\]",
        ),
        (
            lambda: OPS["fused_add_rms_norm"](torch.randn(2, 8), torch.randn(1, 8), None, EPS),
            r"x_residual has shape \[1, 8\] but x has \[2, 8\]",
        ),
        (
            lambda: OPS["rms_norm_functional"](torch.tensor(1.0), None, EPS),
            "at least one dimension",
        ),
    ],
    ids=["float64", "weight-dtype", "weight-shape", "out-shape", "residual-shape", "0-d"],
)
def test_errors_say_what_is_wrong(kernels: Path, call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RuntimeError, match=message):
        call()


def test_aliased_activations_are_refused(kernels: Path) -> None:
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="unsupported operation"):
        OPS["fused_add_rms_norm"](x, x, None, EPS)


def test_meta_tensors_trace_without_the_library() -> None:
    """Schemas and fake impls are Python: tracing needs no build."""
    x = torch.empty(3, 64, device="meta")
    out = OPS["rms_norm_functional"](x, None, EPS)
    assert out.shape == (3, 64)
    assert out.device.type == "meta"


def test_first_call_in_a_fresh_process_builds_through_the_op(kernels: Path) -> None:
    """A kernel op called before any impl (as a graph from Inductor's cache does)
    builds, or here loads from the cache, the library itself."""
    code = (
        "import torch, vllm_ir as ir\n"
        "import vllm_ir_cpu.library\n"
        "from vllm_ir_cpu import build\n"
        "assert not build.is_loaded()\n"
        "x, w = torch.randn(3, 64), torch.rand(64)\n"
        "got = torch.ops.vllm_ir_cpu.rms_norm_functional(x, w, 1e-6)\n"
        "assert build.is_loaded()\n"
        "torch.testing.assert_close(got, ir.ops.rms_norm.native(x, w, 1e-6))\n"
        "print('ok')\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_non_cpu_tensors_are_refused_before_building() -> None:
    kernel = library._build_then_call("rms_norm_functional")
    with pytest.raises(NotImplementedError, match="CPU tensors only, got tensors on meta"):
        kernel(torch.empty(2, 8, device="meta"), None, EPS)
