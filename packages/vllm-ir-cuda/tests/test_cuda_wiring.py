"""The impls' wiring on CPU: the real impl functions over CPU stand-in kernels.

What a GPU would add is the kernels' arithmetic, which test_gpu.py checks;
everything between the IR op and the kernel op (argument order, the output
buffer, the in-place contract, layouts the kernels do not read directly,
tracing and compiling with zero clones) runs here.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import vllm_ir as ir
from cuda_stand_ins import STANDIN, StandInKernels, accepted_samples, conformance_params
from vllm_ir.testing import ConformanceCase, TinyDecoder, inductor_caches_off
from vllm_ir_cuda import layernorm, ops

RMS = ir.ops.rms_norm
FUSED = ir.ops.fused_add_rms_norm
HIDDEN, LAYERS = 64, 3


def _close(got: object, want: object, dtype: torch.dtype) -> None:
    tol = RMS.tolerance(dtype)
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)


def _with_variance_size(sample: Any) -> None:
    # the only samples the impl declines: the kernels normalize whole rows
    assert sample.args[3:]
    assert sample.args[3] is not None


@pytest.mark.parametrize("dtype", ops.DTYPES, ids=str)
def test_rms_norm_impl_matches_native_on_samples(standin: StandInKernels, dtype) -> None:  # type: ignore[no-untyped-def]
    ran = 0
    for sample in accepted_samples(RMS, dtype, declined=_with_variance_size):
        x = sample.args[0]
        before = x.clone()
        got = layernorm.rms_norm(*sample.args)
        _close(got, RMS.native(*sample.args), dtype)
        assert got.dtype == x.dtype
        assert got.shape == x.shape
        assert torch.equal(x, before)  # functional: x untouched
        ran += 1
    assert standin.calls["rms_norm"] == ran > 0


@pytest.mark.parametrize("dtype", ops.DTYPES, ids=str)
def test_fused_impl_writes_its_results_into_the_activations(standin: StandInKernels, dtype) -> None:  # type: ignore[no-untyped-def]
    ran = 0
    for sample in accepted_samples(FUSED, dtype):
        want = FUSED.native(*sample.clone().args)
        args = sample.clone().args
        x, residual = args[0], args[1]
        got = layernorm.fused_add_rms_norm(*args)
        assert got[0] is x
        assert got[1] is residual
        _close(got, want, dtype)
        # the residual is the rounded sum, exactly
        assert torch.equal(residual, sample.args[0] + sample.args[1])
        ran += 1
    assert standin.calls["fused_add_rms_norm"] == ran > 0


def test_layouts_the_kernels_do_not_read_are_copied(standin: StandInKernels) -> None:
    x = torch.randn(HIDDEN, 6).t()  # last dimension strided
    w = torch.randn(2 * HIDDEN)[::2]  # non-contiguous weight
    assert x.stride(-1) != 1
    assert not w.is_contiguous()
    _close(layernorm.rms_norm(x, w, 1e-6), RMS.native(x, w, 1e-6), torch.float32)

    r = torch.randn(HIDDEN, 6).t()
    want = FUSED.native(x.clone(), r.clone(), w, 1e-6)
    x_ptr, r_ptr = x.data_ptr(), r.data_ptr()
    got = layernorm.fused_add_rms_norm(x, r, w, 1e-6)
    assert got[0] is x
    assert got[1] is r
    assert (x.data_ptr(), r.data_ptr()) == (x_ptr, r_ptr)
    _close(got, want, torch.float32)
    assert standin.calls == {"rms_norm": 1, "fused_add_rms_norm": 1}


def test_default_overload_keeps_inputs_and_maybe_inplace_reuses_them(
    standin: StandInKernels,
) -> None:
    x, r, w = torch.randn(4, HIDDEN), torch.randn(4, HIDDEN), torch.randn(HIDDEN)
    x0, r0 = x.clone(), r.clone()
    want = FUSED.native(x, r, w, 1e-6)
    with FUSED.set_priority([STANDIN]):
        assert FUSED.selected_impl(x, r, w, 1e-6).provider == STANDIN
        out = FUSED(x, r, w, 1e-6)
        assert torch.equal(x, x0)
        assert torch.equal(r, r0)
        _close(out, want, torch.float32)
        out = FUSED.maybe_inplace(x, r, w, 1e-6)
        assert out[0].data_ptr() == x.data_ptr()
        assert out[1].data_ptr() == r.data_ptr()
        _close(out, want, torch.float32)
    assert standin.calls["fused_add_rms_norm"] == 2


@pytest.mark.parametrize("weighted", [True, False], ids=["weight", "no-weight"])
def test_opcheck_kernel_ops_over_standins(cpu_kernels: StandInKernels, weighted: bool) -> None:
    # the schemas (what is written) and fake impls against kernels that write exactly that
    x, r = torch.randn(4, HIDDEN, dtype=torch.float16), torch.randn(4, HIDDEN, dtype=torch.float16)
    w = torch.randn(HIDDEN, dtype=torch.float16) if weighted else None
    torch.library.opcheck(ops.rms_norm, (torch.empty_like(x), x, w, 1e-6))
    torch.library.opcheck(ops.fused_add_rms_norm, (x.clone(), r.clone(), w, 1e-6))


@pytest.mark.parametrize(
    ("op_name", "check", "dtype"), conformance_params(("rms_norm", "fused_add_rms_norm"))
)
def test_conformance_kit(standin: StandInKernels, op_name: str, check: str, dtype) -> None:  # type: ignore[no-untyped-def]
    ConformanceCase(ir.get_op(op_name), STANDIN, check, dtype, "cpu").check()


# -- compiled: the real impl functions lowered by the vllm_ir backend -------


_no_cache = inductor_caches_off


def test_compiled_decoder_runs_the_kernels_in_place_without_clones(
    standin: StandInKernels,
) -> None:
    torch._dynamo.reset()
    model = TinyDecoder(HIDDEN, LAYERS).eval()
    priority = {"rms_norm": [STANDIN], "fused_add_rms_norm": [STANDIN]}
    backend = ir.VllmIRBackend(priority=priority)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    x = torch.randn(5, HIDDEN)
    with torch.no_grad():
        with ir.IrOpPriorityConfig(**priority).scope():
            eager = model(x.clone())
        with _no_cache():
            got = compiled(x.clone())
        standin.calls.clear()
        again = compiled(x.clone())
    _close(got, eager, torch.float32)
    _close(again, eager, torch.float32)
    # the compiled graph calls the kernel ops themselves
    assert standin.calls == {"rms_norm": 1, "fused_add_rms_norm": LAYERS}
    assert backend.lowering_pass.selected_impls["rms_norm"] == {"rms_norm": STANDIN}
    assert set(backend.lowering_pass.selected_impls["fused_add_rms_norm"].values()) == {STANDIN}
    ctx = backend.pass_contexts[0]
    assert not ctx.from_cache
    assert ctx.clones_inserted == 2 * LAYERS
    assert ctx.clones_removed == 2 * LAYERS, ctx.clones_kept


def test_compiled_rms_norm_of_a_row_strided_input(standin: StandInKernels) -> None:
    torch._dynamo.reset()
    backend = ir.VllmIRBackend(priority={"rms_norm": [STANDIN]})
    fn = torch.compile(lambda x, w: RMS(x, w, 1e-6), backend=backend, dynamic=False)
    x, w = torch.randn(4, 2 * HIDDEN)[:, :HIDDEN], torch.randn(HIDDEN)
    with _no_cache():
        got = fn(x, w)
    _close(got, RMS.native(x, w, 1e-6), torch.float32)
    assert backend.lowering_pass.selected_impls["rms_norm"] == {"rms_norm": STANDIN}
