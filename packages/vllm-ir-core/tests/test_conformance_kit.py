"""The conformance kit catches what it promises to catch."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import torch
import vllm_ir as ir
from torch import Tensor
from vllm_ir.testing import (
    ConformanceError,
    assert_conforms,
    check_provider,
    conformance_cases,
)

RMS = ir.ops.rms_norm
FUSED = ir.ops.fused_add_rms_norm
FAST_CHECKS = ("correctness", "supports_args", "mutation", "opcheck")


@pytest.fixture
def registered() -> Iterator[list[tuple[ir.IrOp, str]]]:
    made: list[tuple[ir.IrOp, str]] = []
    yield made
    for op, provider in made:
        op.unregister_impl(provider)


def _rms(provider: str, fn, made, **kwargs) -> None:  # type: ignore[no-untyped-def]
    RMS.register_impl(provider, **kwargs)(fn)
    made.append((RMS, provider))


def good_rms(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    return RMS.native(x, weight, epsilon, variance_size)


def wrong_rms(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    return RMS.native(x, weight, epsilon * 1e4, variance_size)  # epsilon misapplied


def mutating_rms(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    return x.copy_(RMS.native(x, weight, epsilon, variance_size))


def batch_guard(x, weight, epsilon, variance_size=None):  # type: ignore[no-untyped-def]
    return x.shape[0] >= 1


def test_a_correct_provider_conforms(registered) -> None:  # type: ignore[no-untyped-def]
    _rms(
        "kit_good",
        good_rms,
        registered,
        supports_args=lambda x, weight, epsilon, variance_size=None: x.dtype != torch.float16,
    )
    assert_conforms("kit_good", checks=FAST_CHECKS)


def test_a_wrong_result_is_caught(registered) -> None:  # type: ignore[no-untyped-def]
    _rms("kit_wrong", wrong_rms, registered)
    report = check_provider("kit_wrong", checks=("correctness",), dtypes=(torch.float32,))
    assert len(report.failures) == 1
    failure = report.failures[0]
    assert failure.startswith("rms_norm-kit_wrong-correctness-float32: sample 1x64: ")
    assert "64 of 64 elements outside the tolerance; largest abs diff " in failure
    # where, with both values, then the largest relative difference and the tolerance
    assert re.search(r"diff [0-9.e-]+ at \(0, \d+\) \(got -?[0-9.]+, want -?[0-9.]+\)", failure)
    assert re.search(r"largest rel diff [0-9.e-]+ at \(0, \d+\)", failure)
    assert "(tolerance atol=1e-05, rtol=1e-05)" in failure
    assert "; sample 4x64-no-weight: " in failure  # every failing sample, by name


def test_a_wrong_second_output_names_the_output(registered) -> None:  # type: ignore[no-untyped-def]
    def wrong_residual(
        x: Tensor,
        x_residual: Tensor,
        weight: Tensor | None,
        epsilon: float,
        variance_size: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        out, res = FUSED.native(x, x_residual, weight, epsilon, variance_size)
        res = res.clone()
        res[0, -1] += 1.0
        return out, res

    FUSED.register_impl("kit_wrong_residual")(wrong_residual)
    registered.append((FUSED, "kit_wrong_residual"))
    report = check_provider("kit_wrong_residual", checks=("correctness",), dtypes=(torch.float32,))
    assert "sample 1x64: output 1: 1 of 64 elements outside the tolerance; " in (report.failures[0])
    assert "largest abs diff 1 at (0, 63)" in report.failures[0]


def test_an_inplace_impl_that_never_writes_in_place_is_caught(registered) -> None:  # type: ignore[no-untyped-def]
    def out_of_place(
        x: Tensor,
        x_residual: Tensor,
        weight: Tensor | None,
        epsilon: float,
        variance_size: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        return FUSED.native(x, x_residual, weight, epsilon, variance_size)

    FUSED.register_impl("kit_never_inplace", inplace=True)(out_of_place)
    registered.append((FUSED, "kit_never_inplace"))
    with pytest.raises(
        ConformanceError,
        match=r"registered inplace=True but returned none of the activations "
        r"\['x', 'x_residual'\] on any sample",
    ):
        assert_conforms("kit_never_inplace", checks=("mutation",), dtypes=(torch.float32,))


def test_an_unknown_provider_names_the_known_ones_and_load_errors(
    registered,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm_ir._discovery import providers

    _rms("kit_acme", good_rms, registered)
    error = providers.ProviderLoadError("acme_gpu", "acme-kernels 0.1", "ImportError: no GPU", "")
    monkeypatch.setattr(providers, "load_errors", lambda: {"acme_gpu": error})
    monkeypatch.setenv("VLLM_IR_PROVIDERS", "other")
    with pytest.raises(LookupError) as info:
        check_provider("kit_acmee")
    message = str(info.value)
    assert message.startswith("provider 'kit_acmee' has no impls; providers with impls: ")
    known = message.split("; ")[1].removeprefix("providers with impls: ").split(", ")
    assert {"kit_acme", "native"} <= set(known)
    assert "did you mean 'kit_acme'?" in message
    assert "VLLM_IR_PROVIDERS=other does not name it" in message
    assert "provider acme_gpu (acme-kernels 0.1) failed to load: ImportError: no GPU" in message
    with pytest.raises(
        LookupError,
        match=r"implements none of the ops checked \(silu_and_mul\); "
        r"it implements rms_norm",
    ):
        conformance_cases("kit_acme", ops=[ir.ops.silu_and_mul])


def test_an_undeclared_inplace_impl_is_caught(registered) -> None:  # type: ignore[no-untyped-def]
    _rms("kit_mutating", mutating_rms, registered)
    with pytest.raises(
        ConformanceError, match=r"writes \['x'\] but is not registered inplace=True"
    ):
        assert_conforms("kit_mutating", checks=("mutation",), dtypes=(torch.float32,))


def test_a_batch_guarding_supports_args_is_caught(registered) -> None:  # type: ignore[no-untyped-def]
    _rms("kit_guard", good_rms, registered, supports_args=batch_guard)
    with pytest.raises(ConformanceError, match="returned SymBool for a symbolic batch size"):
        assert_conforms("kit_guard", checks=("supports_args",), dtypes=(torch.float32,))


@pytest.mark.parametrize(
    ("case", "predicate", "what"),
    [
        (
            "batch parity",
            lambda x, weight, epsilon, variance_size=None: x.dim() < 2 or x.shape[0] % 2 == 0,
            "batch size",
        ),
        (
            "storage offset",
            lambda x, weight, epsilon, variance_size=None: x.storage_offset() == 0,
            "storage offset shifted",
        ),
        (
            "32-byte alignment",
            lambda x, weight, epsilon, variance_size=None: x.data_ptr() % 32 == 0,
            "storage offset shifted by 16 bytes",
        ),
        (
            "values",
            lambda x, weight, epsilon, variance_size=None: bool(x.flatten()[0] != 3.0),
            "other values",
        ),
    ],
)
def test_a_predicate_reading_outside_the_dispatch_key_is_caught(  # type: ignore[no-untyped-def]
    registered, case: str, predicate, what: str
) -> None:
    _rms("kit_offkey", good_rms, registered, supports_args=predicate)
    report = check_provider("kit_offkey", checks=("supports_args",), dtypes=(torch.float32,))
    assert report.failures, case
    assert any(what in f and "share the selection key" in f for f in report.failures), (
        report.failures
    )


def test_a_predicate_reading_only_key_facts_passes(registered) -> None:  # type: ignore[no-untyped-def]
    from vllm_ir._schema.layout import rows_flatten_free

    def key_facts_only(x, weight, epsilon, variance_size=None):  # type: ignore[no-untyped-def]
        return (
            x.shape[-1] % 8 == 0  # the hidden size
            and rows_flatten_free(x)  # strides
            and (weight is None or (weight.is_contiguous() and weight.device == x.device))
            and variance_size is None
        )

    _rms("kit_onkey", good_rms, registered, supports_args=key_facts_only)
    report = check_provider("kit_onkey", checks=("supports_args",), dtypes=(torch.float32,))
    assert report.failures == []
    assert report.passed


def test_an_inplace_impl_must_return_what_it_writes(registered) -> None:  # type: ignore[no-untyped-def]
    def writes_but_returns_new(
        x: Tensor,
        x_residual: Tensor,
        weight: Tensor | None,
        epsilon: float,
        variance_size: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        out, res = FUSED.native(x, x_residual, weight, epsilon, variance_size)
        x_residual.copy_(res)
        return out, res.clone()

    FUSED.register_impl("kit_half_inplace", inplace=True)(writes_but_returns_new)
    registered.append((FUSED, "kit_half_inplace"))
    with pytest.raises(ConformanceError, match=r"writes \['x_residual'\] but does not return"):
        assert_conforms("kit_half_inplace", checks=("mutation",), dtypes=(torch.float32,))


def test_an_inplace_impl_may_reuse_only_some_activations(registered) -> None:  # type: ignore[no-untyped-def]
    def reuses_the_residual(
        x: Tensor,
        x_residual: Tensor,
        weight: Tensor | None,
        epsilon: float,
        variance_size: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        out, res = FUSED.native(x, x_residual, weight, epsilon, variance_size)
        return out, x_residual.copy_(res)

    FUSED.register_impl("kit_residual_only", inplace=True)(reuses_the_residual)
    registered.append((FUSED, "kit_residual_only"))
    assert_conforms("kit_residual_only", checks=("mutation",), dtypes=(torch.float32,))


def test_compiled_check_runs_the_backend(registered) -> None:  # type: ignore[no-untyped-def]
    _rms("kit_compiled", good_rms, registered)
    with torch._inductor.config.patch(fx_graph_cache=False):
        assert_conforms("kit_compiled", checks=("compiled",))


def test_cases_parametrize_per_op_check_and_dtype(registered) -> None:  # type: ignore[no-untyped-def]
    _rms("kit_cases", good_rms, registered)
    cases = conformance_cases("kit_cases")
    assert str(cases[0]) == "rms_norm-kit_cases-correctness-float32"
    assert sum(1 for c in cases if c.check_name == "compiled") == 1
    with pytest.raises(LookupError, match="'no_such_provider' has no impls; providers with"):
        conformance_cases("no_such_provider")
    with pytest.raises(ValueError, match="unknown checks"):
        conformance_cases("kit_cases", checks=("speed",))


# -- sample coverage: odd widths, a provider's own extra samples ----------------


def test_a_kernel_raising_on_odd_hidden_sizes_fails_the_kit(registered) -> None:  # type: ignore[no-untyped-def]
    """Vector kernels often assume an even (or 4-, 8-aligned) hidden size: core's
    samples include an odd one, so such a kernel must decline it in supports_args."""

    def even_only(
        x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
    ) -> Tensor:
        if x.shape[-1] % 2:
            raise RuntimeError("hidden size must be even")
        return good_rms(x, weight, epsilon, variance_size)

    _rms("kit_even_only", even_only, registered)
    report = check_provider("kit_even_only", checks=("correctness",), dtypes=(torch.float32,))
    assert len(report.failures) == 1
    assert "odd-hidden" in report.failures[0]
    assert "hidden size must be even" in report.failures[0]
    for op in (RMS, FUSED, ir.ops.silu_and_mul, ir.ops.dynamic_per_token_fp8_quant):
        widths = {s.args[0].shape[-1] for s in op.sample_inputs(torch.float32)}
        half = op is ir.ops.silu_and_mul  # its kernels see halves of the last dimension
        assert any((w // 2 if half else w) % 2 for w in widths), op.name


def test_a_provider_adds_samples_for_its_own_impls_only(registered) -> None:  # type: ignore[no-untyped-def]
    """The shape a kernel special-cases (here 48) joins that provider's checks, and
    nobody else's; core's samples stay as they are."""

    def wrong_at_48(
        x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
    ) -> Tensor:
        out = good_rms(x, weight, epsilon, variance_size)
        return out * 2 if x.shape[-1] == 48 else out

    _rms("kit_special", wrong_at_48, registered)
    _rms("kit_other", wrong_at_48, registered)
    core = [s.name for s in RMS.sample_inputs(torch.float32)]
    fp32 = {"checks": ("correctness",), "dtypes": (torch.float32,)}
    assert not check_provider("kit_special", **fp32).failures  # type: ignore[arg-type]

    def at_48(dtype: torch.dtype, device: torch.device) -> Iterator[ir.SampleInput]:
        x = torch.randn(3, 48).to(device=device, dtype=dtype)
        yield ir.SampleInput((x, None, 1e-6), "3x48-special")

    with ir.provider.recording_registrations("kit_special") as log:
        RMS.register_extra_samples("kit_special")(at_48)
    try:
        report = check_provider("kit_special", checks=("correctness",), dtypes=(torch.float32,))
        assert len(report.failures) == 1
        assert "sample 3x48-special" in report.failures[0]
        other = check_provider("kit_other", checks=("correctness",), dtypes=(torch.float32,))
        assert not other.failures
        assert [s.name for s in RMS.sample_inputs(torch.float32)] == core
        names = [s.name for s in RMS.sample_inputs(torch.float32, provider="kit_special")]
        assert names == [*core, "3x48-special"]
    finally:
        log.remove()
    assert [s.name for s in RMS.sample_inputs(torch.float32, provider="kit_special")] == core
    with pytest.raises(TypeError, match="takes a provider name"):
        RMS.register_extra_samples(at_48)  # type: ignore[arg-type]


def column_major_rms(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    out = RMS.native(x, weight, epsilon, variance_size)
    return out.t().contiguous().t() if x.shape[0] > 1 else out  # strides the fake impl lacks


def test_opcheck_compares_the_fake_impl_on_every_sample(registered) -> None:  # type: ignore[no-untyped-def]
    _rms("kit_column_major", column_major_rms, registered)
    report = check_provider("kit_column_major", checks=("opcheck",), dtypes=(torch.float32,))
    (failure,) = report.failures
    # the first sample (1x64) has rows-major strides: every later 2-d one is caught
    assert "on sample 1x64" not in failure
    assert "vllm_ir.rms_norm.default on sample 7x96: " in failure
    assert "test_faketensor failed" in failure
    assert "Stride mismatch" in failure
    assert "on sample 16x1000: " in failure


def test_opcheck_traces_the_fake_impl_under_dynamic_shapes_once(  # type: ignore[no-untyped-def]
    registered, monkeypatch: pytest.MonkeyPatch
) -> None:
    _rms("kit_counted", good_rms, registered)
    opcheck = torch.library.opcheck
    tests_run: list[object] = []

    def recording(op, args, **options):  # type: ignore[no-untyped-def]
        tests_run.append(options.get("test_utils", "all"))
        return opcheck(op, args, **options)

    monkeypatch.setattr(torch.library, "opcheck", recording)
    report = check_provider("kit_counted", checks=("opcheck",), dtypes=(torch.float32,))
    assert report.failures == []
    # rms_norm has one overload: one call a sample, opcheck's default four tests
    # on the first, the three that run the impl on the others
    cheap = ("test_schema", "test_autograd_registration", "test_faketensor")
    samples = len(list(RMS.sample_inputs(torch.float32)))
    assert tests_run == ["all", *[cheap] * (samples - 1)]
