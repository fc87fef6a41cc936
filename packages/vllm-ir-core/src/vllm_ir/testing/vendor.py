"""The shared tests of vendor-wrapper packages (:class:`vllm_ir.kits.vendor.VendorNorm`).

vllm-ir-rocm and vllm-ir-xpu wrap a vendor's RMSNorm kernels through the
same helper, so most of what their tests check is the same: the wiring over
CPU stand-ins of the vendor kernels, the opaque ops, ``torch.compile``, the
platform defaults, discovery, availability, conformance and, on the vendor's
GPU, the real kernels. A package describes itself once in a
:class:`VendorUnderTest` table, and each test module subclasses the checks it
runs::

    # tests/conftest.py
    from my_stand_ins import VENDOR
    from vllm_ir.testing.vendor import vendor_fixtures

    pytest_configure, _isolated_state, stand_in, kernels = vendor_fixtures(VENDOR)

    # tests/test_wiring.py
    from my_stand_ins import VENDOR
    from vllm_ir.testing.vendor import WiringChecks

    class TestWiring(WiringChecks):
        vendor = VENDOR

A package keeps in its own tests only what is its own (the vendor's call
arguments, its probe's checks, layouts only one vendor accepts). Stand-ins
build on :class:`StandInKernels`, which records every call.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
import torch
from torch import Tensor

from vllm_ir import ops
from vllm_ir._discovery import providers
from vllm_ir._discovery.providers import loaded_providers
from vllm_ir._op.op import IrOp, get_op
from vllm_ir.priority import (
    PlatformDefaults,
    add_platform_defaults,
    platform_default_contributions,
    remove_platform_defaults,
)
from vllm_ir.selection import invalidate_caches
from vllm_ir.testing import ConformanceCase, conformance_cases
from vllm_ir.testing.compiled import CompiledDecoderChecks
from vllm_ir.testing.isolation import SELECTION_ENV, isolated

__all__ = [
    "AvailabilityChecks",
    "Call",
    "CompileChecks",
    "ConformanceChecks",
    "DefaultsChecks",
    "DiscoveryChecks",
    "HardwareChecks",
    "OpsChecks",
    "StandInKernels",
    "VendorUnderTest",
    "WiringChecks",
    "check_rows",
    "reference_rms",
    "stand_in_module",
    "vendor_fixtures",
]

OPS = ("rms_norm", "fused_add_rms_norm")


# -- stand-ins ---------------------------------------------------------------------


@dataclass
class Call:
    """One call of a stand-in kernel: its name and its arguments by the vendor's names."""

    name: str
    args: dict[str, Any]


@dataclass
class StandInKernels:
    """Base of a CPU stand-in for a vendor library: ``modules`` for ``sys.modules``, the calls.

    A subclass fills ``modules`` (in ``__post_init__``) and calls :meth:`record`
    from its kernels; it is entered while installed (override ``__enter__`` to
    route calls to it).
    """

    calls: list[Call] = field(default_factory=list)
    modules: dict[str, types.ModuleType] = field(init=False, default_factory=dict)

    def __enter__(self) -> StandInKernels:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def record(self, name: str, **args: Any) -> None:
        """Note a call of kernel ``name`` with ``args``."""
        self.calls.append(Call(name, args))

    def named(self, name: str) -> list[Call]:
        """The calls of kernel ``name``."""
        return [c for c in self.calls if c.name == name]


def stand_in_module(name: str, doc: str, origin: str) -> types.ModuleType:
    """An empty module ``name`` that looks imported from ``origin`` (a stand-in's file)."""
    module = types.ModuleType(name, doc)
    module.__file__ = origin
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, origin=origin)
    return module


def check_rows(
    name: str, package: str, input: Tensor, weight: Tensor, dtypes: Sequence[torch.dtype]
) -> None:
    """What every vendor kernel asks of the rows ``package`` promises to pass it."""
    assert input.dim() == 2, f"stand-in {name}: {package} passes 2-D rows, got {input.dim()}-D"
    assert input.dtype in dtypes, f"stand-in {name}: unsupported dtype {input.dtype}"
    assert weight.dtype == input.dtype, f"stand-in {name}: weight dtype must match input"
    assert weight.is_contiguous(), f"stand-in {name}: weight must be contiguous"
    assert weight.shape == (input.shape[-1],), f"stand-in {name}: weight length != hidden"
    assert input.stride(-1) == 1, f"stand-in {name}: last dim must be contiguous"


def reference_rms(x: Tensor, weight: Tensor, epsilon: float, *, weight_in_fp32: bool) -> Tensor:
    """RMSNorm accumulated in fp32; the weight applied in fp32 (one rounding) or after it."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    if weight_in_fp32:
        return (normed * weight.float()).to(x.dtype)
    return normed.to(x.dtype) * weight


# -- the table -------------------------------------------------------------------


@dataclass(frozen=True)
class VendorUnderTest:
    """What the shared checks need to know of one vendor-wrapper package.

    Attributes:
        package: its import name (``"vllm_ir_rocm"``): it has ``PROVIDER``,
            ``provider``, ``UNSUPPORTED_REASON`` and the modules
            ``availability``, ``layernorm`` and ``ops``.
        distribution: its pip name (``"vllm-ir-rocm"``).
        platform: the vllm-ir platform of its defaults (``"rocm"``).
        device_type: the torch device type of its GPU (``"cuda"`` on ROCm).
        eager_default: its eager list on ``platform``, before other packages'.
        rms_call, fused_call: the names the stand-in records for the two kernels.
        residual_arg: the vendor's name of the residual argument of ``fused_call``.
        declined_dtype: a floating dtype the kernels do not take.
        stand_in: makes the package's :class:`StandInKernels`.
        on_vendor_build: whether torch here is the vendor's build (the
            checks of an unsupported report are skipped there).
        not_here: what the unsupported reason says on a machine that is not.
        gpu: how skip reasons name what the hardware checks need.
        pretend_gpu: makes torch look like the vendor's build with its GPU
            (a test's ``monkeypatch``).
        not_installed: what the reason says when the vendor library is absent.
        import_failure: ``(module, error, reason)``: importing ``module`` (one
            of the stand-in's) raising ``error`` must give a reason with ``reason``.
        neighbours: the other provider packages that contribute defaults on
            ``platform``: import name -> the defaults to stand in for them where
            they are not installed (same platforms and ranks).
        with_neighbours: the eager list after ``eager_default`` once those
            neighbours' defaults are added (``native`` last).
    """

    package: str
    distribution: str
    platform: str
    device_type: str
    eager_default: tuple[str, ...]
    rms_call: str
    fused_call: str
    residual_arg: str
    declined_dtype: torch.dtype
    stand_in: Callable[[], StandInKernels]
    on_vendor_build: Callable[[], bool]
    not_here: str
    gpu: str
    pretend_gpu: Callable[[pytest.MonkeyPatch], None]
    not_installed: str
    import_failure: tuple[str, BaseException, str]
    neighbours: Mapping[str, Sequence[PlatformDefaults]] = field(default_factory=dict)
    with_neighbours: tuple[str, ...] = ("native",)

    def module(self, name: str = "") -> Any:
        """The package (or its submodule ``name``)."""
        return importlib.import_module(f"{self.package}.{name}" if name else self.package)

    @property
    def provider(self) -> str:
        return str(self.module().PROVIDER)

    @property
    def dtypes(self) -> tuple[torch.dtype, ...]:
        return tuple(self.module("ops").DTYPES)

    def op(self, name: str) -> Any:
        """``torch.ops.<package>.<name>.default``, the opaque op."""
        return getattr(getattr(torch.ops, self.module("ops").NAMESPACE), name).default

    def register_again(self) -> Any:
        """Unregister the impls and register them as the availability now says."""
        for op in OPS:
            get_op(op).unregister_impl(self.provider)
        return self.module("layernorm").register_kernels(self.provider)


def vendor_fixtures(vendor: VendorUnderTest) -> tuple[Callable[..., None], Any, Any, Any]:
    """``(pytest_configure, _isolated_state, stand_in, kernels)`` for a package's conftest.

    * ``pytest_configure`` loads the provider once, at collection;
    * ``_isolated_state`` (autouse): selection state reset per test,
      ``VLLM_IR_PROVIDERS`` unset too;
    * ``stand_in`` (per module): the impls registered supported, on CPU, over
      the stand-in modules; afterwards the registration the machine supports
      is restored;
    * ``kernels``: ``stand_in`` with its call record emptied for this test.
    """

    def pytest_configure(config: pytest.Config) -> None:
        # at collection, so that parametrizing over the provider's impls finds them
        provider = vendor.provider
        if provider not in loaded_providers() and provider not in ops.rms_norm.impls:
            source = f"{vendor.distribution} (source tree)"
            providers.load_provider(provider, source, vendor.module().provider)

    @pytest.fixture(autouse=True, name="_isolated_state")
    def _isolated_state() -> Iterator[None]:
        with isolated((*SELECTION_ENV, "VLLM_IR_PROVIDERS")):
            yield

    @pytest.fixture(scope="module", name="stand_in")
    def stand_in() -> Iterator[StandInKernels]:
        availability = vendor.module("availability")
        with vendor.stand_in() as kernels, pytest.MonkeyPatch.context() as mp:
            for name, module in kernels.modules.items():
                mp.setitem(sys.modules, name, module)
            with availability.forced(availability.Availability(True, device_type="cpu")):
                vendor.register_again()
                yield kernels
        vendor.register_again()

    @pytest.fixture(name="kernels")
    def kernels(stand_in: StandInKernels) -> Iterator[StandInKernels]:
        stand_in.calls.clear()
        yield stand_in
        stand_in.calls.clear()

    return pytest_configure, _isolated_state, stand_in, kernels


# -- helpers of the checks -------------------------------------------------------


def _rows(*shape: int, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).to(dtype)


def _assert_close(got: Tensor, want: Tensor) -> None:
    tol = ops.rms_norm.tolerance(got.dtype)
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol)


def _selected(op: IrOp, provider: str, *args: object) -> str:
    with op.set_priority([provider]):
        return op.select(*args).impl.provider


def _pair(dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    return _rows(4, 64, dtype=dtype), _rows(4, 64, dtype=dtype)


class _Checks:
    vendor: ClassVar[VendorUnderTest]


Args = Callable[[VendorUnderTest], tuple[Any, ...]]

RMS_DECLINES: list[tuple[str, Args]] = [
    ("dtype", lambda v: (_rows(4, 64, dtype=v.declined_dtype), None, 1e-6)),
    ("variance_size", lambda v: (_rows(4, 96), _rows(96), 1e-6, 64)),
    ("weight dtype differs", lambda v: (_rows(4, 64), _rows(64, dtype=torch.float32), 1e-6)),
    ("weight 2-D", lambda v: (_rows(4, 64), _rows(1, 64), 1e-6)),
    ("last dim strided", lambda v: (_rows(64, 4).t(), _rows(64), 1e-6)),
    ("flatten would copy", lambda v: (_rows(3, 4, 64).transpose(0, 1), _rows(64), 1e-6)),
    ("split heads view", lambda v: (_rows(5, 3 * 128)[:, :256].view(5, 2, 128), _rows(128), 1e-6)),
    ("0-d", lambda v: (torch.tensor(1.0, dtype=torch.bfloat16), None, 1e-6)),
]
FUSED_DECLINES: list[tuple[str, Args]] = [
    ("dtype", lambda v: (*_pair(v.declined_dtype), None, 1e-6)),
    ("variance_size", lambda v: (*_pair(torch.bfloat16), _rows(64), 1e-6, 32)),
    (
        "residual dtype differs",
        lambda v: (_rows(4, 64), _rows(4, 64, dtype=torch.float16), None, 1e-6),
    ),
    ("residual rank differs", lambda v: (_rows(4, 64), _rows(64), None, 1e-6)),
    ("x transposed", lambda v: (_rows(64, 4).t(), _rows(4, 64), None, 1e-6)),
    ("residual row-strided", lambda v: (_rows(4, 64), _rows(4, 128)[:, :64], None, 1e-6)),
]


# -- the checks ------------------------------------------------------------------


class WiringChecks(_Checks):
    """The impls over the stand-in kernels: argument mapping, declines, the in-place contract."""

    def test_platform_defaults_select_the_provider(
        self, kernels: StandInKernels, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        v = self.vendor
        monkeypatch.setenv("VLLM_IR_PLATFORM", v.platform)
        invalidate_caches()
        for dtype in v.dtypes:
            x, w = _rows(4, 64, dtype=dtype), _rows(64, dtype=dtype)
            assert ops.rms_norm.selected_impl(x, w, 1e-6).provider == v.provider
            out = ops.rms_norm(x, w, 1e-6)
            _assert_close(out, ops.rms_norm.native(x, w, 1e-6))
        assert len(kernels.named(v.rms_call)) == len(v.dtypes)

    def test_other_platforms_do_not_default_to_the_provider(self, kernels: StandInKernels) -> None:
        x, w = _rows(4, 64), _rows(64)
        assert ops.rms_norm.selected_impl(x, w, 1e-6).provider != self.vendor.provider
        ops.rms_norm(x, w, 1e-6)
        assert kernels.calls == []

    def test_rms_norm_hands_x_rows_weight_and_epsilon(self, kernels: StandInKernels) -> None:
        x, w = _rows(2, 3, 128), _rows(128)
        with ops.rms_norm.set_priority([self.vendor.provider]):
            out = ops.rms_norm(x, w, 1e-5)
        (call,) = kernels.calls
        assert call.name == self.vendor.rms_call
        given = call.args["input"]
        assert given.shape == (6, 128)
        assert given.data_ptr() == x.data_ptr(), "x's rows, not a copy"
        assert call.args["weight"] is w
        assert call.args["epsilon"] == 1e-5
        assert out.shape == x.shape
        assert out.is_contiguous()
        _assert_close(out, ops.rms_norm.native(x, w, 1e-5))

    def test_rms_norm_reads_row_strided_slices_in_place(self, kernels: StandInKernels) -> None:
        x, w = _rows(4, 256)[:, :128], _rows(128)
        assert self.vendor.module("layernorm").rows_flatten_free(x)
        assert not x.is_contiguous()
        with ops.rms_norm.set_priority([self.vendor.provider]):
            assert ops.rms_norm.selected_impl(x, w, 1e-6).provider == self.vendor.provider
            out = ops.rms_norm(x, w, 1e-6)
        given = kernels.calls[0].args["input"]
        assert given.data_ptr() == x.data_ptr()
        assert given.stride() == (256, 1)
        _assert_close(out, ops.rms_norm.native(x, w, 1e-6))

    def test_missing_weight_becomes_ones(self, kernels: StandInKernels) -> None:
        x = _rows(3, 64, dtype=torch.float16)
        with ops.rms_norm.set_priority([self.vendor.provider]):
            out = ops.rms_norm(x, None, 1e-6)
        weight = kernels.calls[0].args["weight"]
        assert weight.dtype == torch.float16
        assert weight.shape == (64,)
        assert bool((weight == 1).all())
        _assert_close(out, ops.rms_norm.native(x, None, 1e-6))

    def test_fused_add_hands_both_activations_to_the_in_place_kernel(
        self, kernels: StandInKernels
    ) -> None:
        x, r, w = _rows(2, 5, 96), _rows(2, 5, 96), _rows(96)
        want = ops.fused_add_rms_norm.native(x, r, w, 1e-6)
        x_ptr, r_ptr = x.data_ptr(), r.data_ptr()
        with ops.fused_add_rms_norm.set_priority([self.vendor.provider]):
            out, residual = ops.fused_add_rms_norm.maybe_inplace(x, r, w, 1e-6)
        (call,) = kernels.calls
        assert call.name == self.vendor.fused_call
        assert call.args["input"].data_ptr() == x_ptr
        assert call.args["input"].shape == (10, 96)
        assert call.args[self.vendor.residual_arg].data_ptr() == r_ptr
        assert call.args["weight"] is w
        assert call.args["epsilon"] == 1e-6
        _assert_close(out, want[0])
        _assert_close(residual, want[1])

    def test_maybe_inplace_outputs_alias_the_donated_activations(
        self, kernels: StandInKernels
    ) -> None:
        x, r, w = _rows(8, 64), _rows(8, 64), _rows(64)
        with ops.fused_add_rms_norm.set_priority([self.vendor.provider]):
            out, residual = ops.fused_add_rms_norm.maybe_inplace(x, r, w, 1e-6)
        assert out.data_ptr() == x.data_ptr()
        assert residual.data_ptr() == r.data_ptr()

    def test_default_overload_leaves_inputs_untouched(self, kernels: StandInKernels) -> None:
        x, r, w = _rows(8, 64), _rows(8, 64), _rows(64)
        x0, r0 = x.clone(), r.clone()
        with ops.fused_add_rms_norm.set_priority([self.vendor.provider]):
            out, residual = ops.fused_add_rms_norm(x, r, w, 1e-6)
        assert len(kernels.calls) == 1, "the kernel ran, on clones"
        assert torch.equal(x, x0)
        assert torch.equal(r, r0)
        assert out.data_ptr() not in (x.data_ptr(), r.data_ptr())
        assert residual.data_ptr() not in (x.data_ptr(), r.data_ptr())
        want = ops.fused_add_rms_norm.native(x0, r0, w, 1e-6)
        _assert_close(out, want[0])
        _assert_close(residual, want[1])

    # declines: another provider (native, or one installed after it) runs them
    @pytest.mark.parametrize(("case", "args"), RMS_DECLINES, ids=[c for c, _ in RMS_DECLINES])
    def test_rms_norm_declines(self, kernels: StandInKernels, case: str, args: Args) -> None:
        provider = self.vendor.provider
        assert _selected(ops.rms_norm, provider, *args(self.vendor)) != provider, case
        assert kernels.calls == []

    @pytest.mark.parametrize(("case", "args"), FUSED_DECLINES, ids=[c for c, _ in FUSED_DECLINES])
    def test_fused_add_rms_norm_declines(
        self, kernels: StandInKernels, case: str, args: Args
    ) -> None:
        provider = self.vendor.provider
        assert _selected(ops.fused_add_rms_norm, provider, *args(self.vendor)) != provider, case
        assert kernels.calls == []

    def test_declines_are_explained(self, kernels: StandInKernels) -> None:
        x = _rows(4, 64, dtype=self.vendor.declined_dtype)
        with ops.rms_norm.set_priority([self.vendor.provider]):
            selection = ops.rms_norm.select(x, None, 1e-6)
        first = selection.decisions[0]
        assert first.entry.provider == self.vendor.provider
        assert not first.accepted
        assert "supports_args returned False" in first.reason

    # Layouts the predicates decline, called directly: selection never sends a
    # declined layout there (strides are in the selection key), but the impls
    # are public functions and must still compute the op exactly.

    def test_rms_norm_on_a_declined_layout_is_still_right(self, kernels: StandInKernels) -> None:
        x, w = _rows(3, 4, 64).transpose(0, 1), _rows(64)
        out = self.vendor.module("layernorm").rms_norm(x, w, 1e-6)
        want = ops.rms_norm.native(x, w, 1e-6)
        assert kernels.calls[0].args["input"].is_contiguous(), "copied to contiguous rows"
        _assert_close(out, want)
        assert out.stride() == want.stride(), "laid out like the native result"

    def test_fused_add_on_declined_layouts_still_writes_its_activations(
        self, kernels: StandInKernels
    ) -> None:
        x, r, w = _rows(64, 4).t(), _rows(4, 128)[:, :64], _rows(64)
        want = ops.fused_add_rms_norm.native(x.clone(), r.clone(), w, 1e-6)
        out, residual = self.vendor.module("layernorm").fused_add_rms_norm(x, r, w, 1e-6)
        assert out is x
        assert residual is r
        _assert_close(x, want[0])
        _assert_close(r, want[1])

    def test_a_declined_layout_after_a_cached_selection_is_selected_afresh(
        self, kernels: StandInKernels
    ) -> None:
        w = _rows(64)
        dense, transposed = _rows(4, 3, 64), _rows(3, 4, 64).transpose(0, 1)
        provider = self.vendor.provider
        with ops.rms_norm.set_priority([provider]):
            fallback = ops.rms_norm.select(transposed, w, 1e-6).impl.provider
            assert fallback != provider
            ops.rms_norm(dense, w, 1e-6)  # caches the selection for dense bf16 rows
            kernels.calls.clear()
            out = ops.rms_norm(transposed, w, 1e-6)  # another key: selected afresh
        assert kernels.calls == []
        want = ops.rms_norm.native(transposed, w, 1e-6)
        _assert_close(out, want)
        if fallback == "native":  # not another installed provider
            assert out.stride() == want.stride()

    def test_sequence_first_batch_1_rows_are_accepted(self, kernels: StandInKernels) -> None:
        # (S, 1, H) from transpose(0, 1) of (1, S, H): contiguous, the size-1
        # dimension's stride is S * H, and .view(-1, H) works
        x = _rows(1, 16, 64).transpose(0, 1)
        r = _rows(1, 16, 64).transpose(0, 1)
        assert x.stride() == (64, 1024, 1)
        assert x.is_contiguous()
        w = _rows(64)
        provider = self.vendor.provider
        with ops.rms_norm.set_priority([provider]):
            assert ops.rms_norm.select(x, w, 1e-6).impl.provider == provider
            _assert_close(ops.rms_norm(x, w, 1e-6), ops.rms_norm.native(x, w, 1e-6))
        with ops.fused_add_rms_norm.set_priority([provider]):
            assert ops.fused_add_rms_norm.select(x, r, w, 1e-6).impl.provider == provider

    def test_empty_inputs_never_reach_the_kernels(self, kernels: StandInKernels) -> None:
        x, r, w = _rows(0, 64), _rows(0, 64), _rows(64)
        layernorm = self.vendor.module("layernorm")
        assert layernorm.rms_norm(x, w, 1e-6).shape == (0, 64)
        layernorm.fused_add_rms_norm(x, r, w, 1e-6)
        assert kernels.calls == []


def _args(dtype: torch.dtype, *shape: int, strided: bool = False) -> tuple[Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    hidden = shape[-1]
    x = torch.randn(*shape[:-1], 2 * hidden if strided else hidden, generator=gen).to(dtype)
    if strided:
        x = x[..., :hidden]
    return (
        x,
        torch.randn(*shape, generator=gen).to(dtype),
        torch.randn(hidden, generator=gen).to(dtype),
    )


SHAPES = [((4, 64), False), ((2, 3, 96), False), ((4, 128), True)]


class OpsChecks(_Checks):
    """The opaque ops on any machine: schemas, fake impls, opcheck, one node per impl call."""

    def test_schemas_mark_written_arguments(self) -> None:
        ns = self.vendor.module("ops").NAMESPACE
        rms, fused = self.vendor.op("rms_norm"), self.vendor.op("fused_add_rms_norm")
        assert str(rms._schema) == (
            f"{ns}::rms_norm(Tensor x, Tensor weight, float epsilon) -> Tensor"
        )
        assert str(fused._schema) == (
            f"{ns}::fused_add_rms_norm(Tensor(a0!) x, Tensor(a1!) x_residual, "
            "Tensor weight, float epsilon) -> ()"
        )
        for op, written in ((rms, set()), (fused, {"x", "x_residual"})):
            mutable = {
                a.name for a in op._schema.arguments if a.alias_info and a.alias_info.is_write
            }
            assert mutable == written

    def test_fake_impls_give_metadata_without_the_vendor_library(self) -> None:
        # no stand-in installed: fake impls never touch the vendor library
        device = self.vendor.device_type
        for dtype in self.vendor.dtypes:
            with torch._subclasses.fake_tensor.FakeTensorMode():
                x = torch.empty(3, 5, 64, dtype=dtype, device=device)
                w = torch.empty(64, dtype=dtype, device=device)
                out = self.vendor.op("rms_norm")(x, w, 1e-6)
                assert (out.shape, out.dtype, out.device.type) == (x.shape, dtype, device)
                assert out.is_contiguous()
                assert self.vendor.op("fused_add_rms_norm")(x, torch.empty_like(x), w, 1e-6) is None

    def test_fake_impls_check_dtypes(self) -> None:
        device, bad = self.vendor.device_type, self.vendor.declined_dtype
        takes = self.vendor.module("ops").KIT.takes
        with torch._subclasses.fake_tensor.FakeTensorMode():
            x = torch.empty(2, 8, dtype=torch.float16, device=device)
            with pytest.raises(RuntimeError, match=r"weight has dtype torch.float64 but x has"):
                self.vendor.op("rms_norm")(
                    x, torch.empty(8, dtype=torch.float64, device=device), 1e-6
                )
            xd = torch.empty(2, 8, dtype=bad, device=device)
            w = torch.empty(8, dtype=bad, device=device)
            with pytest.raises(RuntimeError, match=rf"x has dtype {bad}; {takes}"):
                self.vendor.op("fused_add_rms_norm")(xd, torch.empty_like(xd), w, 1e-6)

    @pytest.mark.parametrize(("shape", "strided"), SHAPES)
    def test_opcheck(self, kernels: StandInKernels, shape: tuple[int, ...], strided: bool) -> None:
        for dtype in self.vendor.dtypes:
            x, r, w = _args(dtype, *shape, strided=strided)
            torch.library.opcheck(self.vendor.op("rms_norm"), (x, w, 1e-6))
            torch.library.opcheck(self.vendor.op("fused_add_rms_norm"), (x, r, w, 1e-6))

    def test_impls_trace_to_one_opaque_node_each(self) -> None:
        from torch.fx.experimental.proxy_tensor import make_fx

        layernorm, device = self.vendor.module("layernorm"), self.vendor.device_type
        with torch._subclasses.fake_tensor.FakeTensorMode():
            x = torch.empty(4, 64, dtype=torch.bfloat16, device=device)
            r = torch.empty_like(x)
            w = torch.empty(64, dtype=torch.bfloat16, device=device)
            rms = make_fx(lambda x, w: layernorm.rms_norm(x, w, 1e-6))(x, w)
            fused = make_fx(lambda x, r, w: layernorm.fused_add_rms_norm(x, r, w, 1e-6))(x, r, w)
        for gm, op in ((rms, "rms_norm"), (fused, "fused_add_rms_norm")):
            targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
            assert targets == [self.vendor.op(op)]

    def test_missing_weight_traces_to_a_ones_tensor(self) -> None:
        from torch.fx.experimental.proxy_tensor import make_fx

        layernorm = self.vendor.module("layernorm")
        with torch._subclasses.fake_tensor.FakeTensorMode():
            x = torch.empty(4, 64, dtype=torch.float16, device=self.vendor.device_type)
            gm = make_fx(lambda x: layernorm.rms_norm(x, None, 1e-6))(x)
        targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
        assert targets[-1] == self.vendor.op("rms_norm")
        assert len(targets) == 2


class CompileChecks(_Checks, CompiledDecoderChecks):
    """The impls through ``torch.compile`` over the stand-ins: lowered as opaque ops, in place
    without clones (:class:`vllm_ir.testing.compiled.CompiledDecoderChecks`), the wrapped
    kernels called, and the compiled defaults."""

    dtype = torch.bfloat16
    dynamic = False
    batches = (5,)

    @property
    def provider(self) -> str:  # type: ignore[override]
        return self.vendor.provider

    @pytest.fixture(scope="class")
    def provider_ready(self, stand_in: StandInKernels) -> StandInKernels:
        return stand_in

    def test_compiled_graph_calls_the_wrapped_kernels(
        self, compiled: tuple[Any, Any, Any], kernels: StandInKernels
    ) -> None:
        with torch.no_grad():
            compiled[1](torch.randn(5, self.hidden, dtype=self.dtype))
        v = self.vendor
        assert [c.name for c in kernels.calls] == [v.rms_call] + [v.fused_call] * self.layers

    def test_compiled_defaults_keep_native(
        self, stand_in: StandInKernels, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("VLLM_IR_PLATFORM", self.vendor.platform)
        invalidate_caches()
        x, w = (
            torch.randn(4, self.hidden, dtype=self.dtype),
            torch.ones(self.hidden, dtype=self.dtype),
        )
        assert ops.rms_norm.select(x, w, 1e-6, mode="compiled").impl.provider == "native"
        assert ops.rms_norm.select(x, w, 1e-6, mode="eager").impl.provider == self.vendor.provider


class ConformanceChecks(_Checks):
    """The conformance kit over the impls, on CPU over the stand-in kernels.

    What it checks there is the wiring: the impls and their predicates keep
    the ops' contracts. The vendor's numerics are checked by
    :class:`HardwareChecks`, on its GPU.
    """

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "case" in metafunc.fixturenames:
            v = self.vendor
            cases = conformance_cases(v.provider, ops=[get_op(op) for op in OPS], dtypes=v.dtypes)
            metafunc.parametrize("case", cases, ids=str)

    def test_conformance(self, stand_in: StandInKernels, case: ConformanceCase) -> None:
        case.check()


class HardwareChecks(_Checks):
    """On the vendor's GPU with its library: the real kernels against the native semantics.

    Skipped elsewhere, with the reason the availability probe gives. These
    use the registration discovery made (no stand-ins).
    """

    @pytest.fixture(autouse=True)
    def _needs_the_gpu(self) -> None:
        found = self.vendor.module("availability").probe()
        if not found.supported:
            pytest.skip(f"needs {self.vendor.gpu}: {found.reason}")

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "gpu_case" in metafunc.fixturenames:
            v = self.vendor
            cases = (
                conformance_cases(
                    v.provider,
                    ops=[get_op(op) for op in OPS],
                    dtypes=v.dtypes,
                    device=v.device_type,
                )
                if v.module("availability").probe().supported
                else []
            )
            metafunc.parametrize("gpu_case", cases, ids=str)

    def test_registered_supported(self) -> None:
        assert ops.rms_norm.impls[self.vendor.provider].supported
        assert ops.fused_add_rms_norm.impls[self.vendor.provider].supported

    def test_conformance_on_gpu(self, gpu_case: ConformanceCase) -> None:
        gpu_case.check()

    @pytest.mark.parametrize("shape", [(1, 4096), (7, 5120), (3, 5, 8192), (513, 7168)])
    def test_in_place_contract_on_gpu(self, shape: tuple[int, ...]) -> None:
        device, provider = self.vendor.device_type, self.vendor.provider
        for dtype in self.vendor.dtypes:
            x = torch.randn(shape, dtype=dtype, device=device)
            r = torch.randn(shape, dtype=dtype, device=device)
            w = 1 + 0.1 * torch.randn(shape[-1], dtype=dtype, device=device)
            want = ops.fused_add_rms_norm.native(x, r, w, 1e-6)
            x0, r0 = x.clone(), r.clone()
            with ops.fused_add_rms_norm.set_priority([provider]):
                out, res = ops.fused_add_rms_norm(x, r, w, 1e-6)
                assert torch.equal(x, x0)
                assert torch.equal(r, r0)
                out2, res2 = ops.fused_add_rms_norm.maybe_inplace(x, r, w, 1e-6)
            assert out2.data_ptr() == x.data_ptr()
            assert res2.data_ptr() == r.data_ptr()
            for got, ref in ((out, want[0]), (res, want[1]), (out2, want[0]), (res2, want[1])):
                _assert_close(got, ref)

    def test_row_strided_rms_norm_on_gpu(self) -> None:
        device, provider = self.vendor.device_type, self.vendor.provider
        wide = torch.randn(64, 2 * 4096, dtype=torch.bfloat16, device=device)
        x, w = wide[:, :4096], torch.randn(4096, dtype=torch.bfloat16, device=device)
        with ops.rms_norm.set_priority([provider]):
            assert ops.rms_norm.selected_impl(x, w, 1e-6).provider == provider
            got = ops.rms_norm(x, w, 1e-6)
        _assert_close(got, ops.rms_norm.native(x, w, 1e-6))


def _defaults_of(module: str, stand_in: Sequence[PlatformDefaults]) -> Sequence[Any]:
    try:
        return importlib.import_module(module).provider.defaults  # type: ignore[no-any-return]
    except ImportError:
        return stand_in


def stand_in_defaults(
    platforms: Sequence[str], eager: Sequence[str], rank: int
) -> list[PlatformDefaults]:
    """A neighbour package's defaults where it is not installed: ``eager`` first for
    the norm ops on each of ``platforms``, ``native`` compiled, at ``rank``."""
    return [
        PlatformDefaults(
            platform,
            eager={op: list(eager) for op in OPS},
            compiled={op: ["native"] for op in OPS},
            rank=rank,
        )
        for platform in platforms
    ]


SOURCE_PREFIX = "zz-test "
"""Names of the contributions a test adds start with this (removed after each test)."""

OTHER_SOURCE = f"{SOURCE_PREFIX}vllm-ir-other"
"""A contribution's name for a package's own tests."""


class DefaultsChecks(_Checks):
    """How the package's platform defaults compose with the other providers' contributions.

    The package's neighbours (:attr:`VendorUnderTest.neighbours`) are taken
    from their installed packages when present, else from the stand-in
    contributions the package gives (same platforms and ranks).
    """

    @pytest.fixture(autouse=True)
    def _on_the_platform(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
        monkeypatch.setenv("VLLM_IR_PLATFORM", self.vendor.platform)
        loaded_providers()  # discovery first: it would not overwrite our contributions
        yield
        for source in [OTHER_SOURCE, *(SOURCE_PREFIX + n for n in self.vendor.neighbours)]:
            remove_platform_defaults(source)

    @staticmethod
    def eager(op: str) -> list[str]:
        return list(get_op(op).get_priority("eager"))

    @pytest.mark.parametrize("op", OPS)
    def test_eager_list_is_the_design_table(self, op: str) -> None:
        v = self.vendor
        eager = self.eager(op)
        assert eager[: len(v.eager_default)] == list(v.eager_default)
        others = [
            source
            for source, _, _ in platform_default_contributions(op, "eager", v.platform)
            if source != v.distribution
        ]
        if not others:  # only this package contributes defaults here (its own test session)
            assert eager == [*v.eager_default, "native"]

    @pytest.mark.parametrize("op", OPS)
    def test_compiled_list_starts_with_native(self, op: str) -> None:
        assert get_op(op).get_priority("compiled")[0] == "native"

    @pytest.mark.parametrize("op", OPS)
    def test_with_the_neighbour_packages_installed(self, op: str) -> None:
        v = self.vendor
        for package, stand_in in v.neighbours.items():
            add_platform_defaults(SOURCE_PREFIX + package, _defaults_of(package, stand_in))
        assert self.eager(op) == [*v.eager_default, *v.with_neighbours]
        assert get_op(op).get_priority("compiled")[0] == "native"

    def test_user_priority_goes_first(self) -> None:
        n = len(self.vendor.eager_default)
        with ops.rms_norm.set_priority(["native"]):
            assert self.eager("rms_norm")[: n + 1] == ["native", *self.vendor.eager_default]

    def test_no_defaults_on_other_platforms(self, monkeypatch: pytest.MonkeyPatch) -> None:
        v = self.vendor
        for platform in sorted({"cuda", "rocm", "xpu", "cpu"} - {v.platform}):
            monkeypatch.setenv("VLLM_IR_PLATFORM", platform)
            assert v.provider not in self.eager("rms_norm"), platform
        assert all(d.platform == v.platform for d in v.module().provider.defaults)

    def test_entries_say_where_they_came_from(self) -> None:
        entries = ops.rms_norm.get_priority_entries("eager")
        assert entries[0].provider == self.vendor.provider
        assert (
            entries[0].source
            == f"{self.vendor.platform} eager default of {self.vendor.distribution}"
        )


def _vllm_ir(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "vllm_ir", *args], capture_output=True, text=True, env=environ
    )


class DiscoveryChecks(_Checks):
    """The installed package as a user meets it: discovered, and explained by ``vllm-ir``.

    Run in fresh interpreters, without stand-ins: off the vendor's build of
    torch the provider loads, registers its impls unsupported, and says why.
    Skipped where the package is not installed (no entry point).
    """

    @pytest.fixture(autouse=True)
    def _installed_elsewhere(self) -> None:
        from importlib import metadata

        names = {ep.name for ep in metadata.entry_points(group="vllm_ir.providers")}
        if self.vendor.provider not in names:
            pytest.skip(f"{self.vendor.distribution} is not installed (no entry point)")
        if self.vendor.on_vendor_build():
            pytest.skip("checks the unsupported report off the vendor's build of torch")

    @pytest.mark.parametrize("op", OPS)
    def test_explain_shows_the_defaults_and_why_the_provider_is_skipped(self, op: str) -> None:
        v = self.vendor
        done = _vllm_ir(
            "explain", op, "--eager", VLLM_IR_PLATFORM=v.platform, VLLM_LOGGING_LEVEL="INFO"
        )
        assert done.returncode == 0, done.stderr
        for i, provider in enumerate(v.eager_default, 1):
            assert (
                f"{i}. {provider}  <- {v.platform} eager default of {v.distribution}" in done.stdout
            )
        assert f"{v.provider}: rejected: not supported on this platform: torch" in done.stdout
        assert f"selected: {v.provider}" not in done.stdout  # native, or another provider
        # the reason, logged when the provider registered its impls
        assert f"provider {v.provider!r} registered as unsupported: torch" in done.stderr
        assert v.not_here in done.stderr

    def test_ops_lists_the_impls_unsupported_and_the_provider_loaded(self) -> None:
        v = self.vendor
        done = _vllm_ir("ops", "--json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["providers"][v.provider].startswith(v.distribution)
        assert v.provider not in report["failed_providers"]
        rows = {(r["op"], r["provider"]): r for r in report["impls"]}
        for op in OPS:
            assert rows[(op, v.provider)]["supported"] is False
            assert rows[(op, v.provider)]["package"].startswith(v.distribution)
        assert rows[("fused_add_rms_norm", v.provider)]["inplace"] is True


class _FailingLoader(importlib.abc.Loader):
    """Loads empty modules; ``failing`` raises ``error``."""

    def __init__(self, failing: str, error: BaseException) -> None:
        self.failing, self.error = failing, error

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == self.failing:
            raise self.error


class _VendorFinder(importlib.abc.MetaPathFinder):
    """Finds the vendor's modules first: absent, or with ``failing`` raising ``error``."""

    def __init__(self, names: Sequence[str], failing: str | None, error: BaseException) -> None:
        self.names, self.failing, self.error = names, failing, error

    def find_spec(self, name: str, path: object, target: object = None) -> Any:
        if name not in self.names:
            return None
        if self.failing is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        package = any(n.startswith(f"{name}.") for n in self.names)
        loader = _FailingLoader(self.failing, self.error)
        return importlib.util.spec_from_loader(name, loader, is_package=package)


class AvailabilityChecks(_Checks):
    """What every package's availability answer promises, whatever its probe checks."""

    @pytest.mark.parametrize("broken", [False, True], ids=["not installed", "import fails"])
    def test_a_missing_or_broken_vendor_library_is_reported(
        self, monkeypatch: pytest.MonkeyPatch, broken: bool
    ) -> None:
        v = self.vendor
        v.pretend_gpu(monkeypatch)
        names = sorted(v.stand_in().modules)
        for name in names:
            monkeypatch.delitem(sys.modules, name, raising=False)
        failing, error, reason = v.import_failure
        finder = _VendorFinder(names, failing if broken else None, error)
        monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
        found = v.module("availability").probe()
        assert not found.supported
        assert found.hardware, "the GPU is there: worth a warning"
        assert (reason if broken else v.not_installed) in (found.reason or "")

    def test_the_vendor_library_on_its_gpu_is_supported(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        v = self.vendor
        v.pretend_gpu(monkeypatch)
        with v.stand_in() as kernels:
            for name, module in kernels.modules.items():
                monkeypatch.setitem(sys.modules, name, module)
            found = v.module("availability").probe()
        assert found.supported
        assert found.reason is None
        assert found.device_type == v.device_type
        assert found.vendor_version == "0.0.0+cpu-stand-in"

    @pytest.mark.parametrize("supported", [False, True], ids=["unsupported", "supported"])
    def test_python_m_reports_and_exits_as_the_answer_says(
        self, capsys: pytest.CaptureFixture[str], supported: bool
    ) -> None:
        v = self.vendor
        package, availability = v.module(), v.module("availability")
        answer = availability.Availability(
            supported, None if supported else "because a test says so", v.device_type
        )
        with availability.forced(answer):
            code = v.module("__main__").main([])
        lines = capsys.readouterr().out.splitlines()
        assert code == (0 if supported else 1)
        assert lines[0].startswith(f"{v.distribution} {package.__version__}: provider ")
        assert lines[1].startswith(f"torch {torch.__version__}, ")
        expected = "supported: yes (" if supported else "supported: no: because a test says so"
        assert lines[2].startswith(expected)

    def test_unsupported_reason_is_exposed(self) -> None:
        package, availability = self.vendor.module(), self.vendor.module("availability")
        assert availability.current().reason == package.UNSUPPORTED_REASON
        with availability.forced(availability.Availability(False, "because a test says so")):
            assert package.UNSUPPORTED_REASON == "because a test says so"
        with availability.forced(availability.Availability(True, device_type="cpu")):
            assert package.UNSUPPORTED_REASON is None

    def test_registered_unsupported_here_with_the_reason_logged(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        v = self.vendor
        if v.on_vendor_build():
            pytest.skip("checks the registration off the vendor's build of torch")
        for op in OPS:
            get_op(op).unregister_impl(v.provider)
        with caplog.at_level("INFO", logger=f"vllm_ir.providers.{v.provider}"):
            found = v.module("layernorm").register_kernels()
        assert not found.supported
        assert not ops.rms_norm.impls[v.provider].supported
        assert not ops.fused_add_rms_norm.impls[v.provider].supported
        assert ops.fused_add_rms_norm.impls[v.provider].inplace
        messages = [r.getMessage() for r in caplog.records]
        assert any("registered as unsupported" in m and v.not_here in m for m in messages)
        assert all(r.levelname == "INFO" for r in caplog.records)

    def test_importing_the_package_imports_no_vendor_code(self) -> None:
        vendor_modules = sorted(self.vendor.stand_in().modules)
        code = (
            f"import sys, {self.vendor.package}\n"
            f"assert not set({vendor_modules!r}) & set(sys.modules)\n"
            f"assert '{self.vendor.package}.layernorm' not in sys.modules\n"
            f"print({self.vendor.package}.provider.name)\n"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == self.vendor.provider

    def test_module_command_reports_why(self) -> None:
        v = self.vendor
        if v.on_vendor_build():
            pytest.skip("checks the report off the vendor's build of torch")
        done = subprocess.run(
            [sys.executable, "-m", v.package], capture_output=True, text=True, check=False
        )
        assert done.returncode == 1
        assert f"provider {v.provider!r}" in done.stdout
        assert "supported: no: torch" in done.stdout
        assert v.not_here in done.stdout

    def test_package_docstring_example(self) -> None:
        results = doctest.testmod(self.vendor.module(), raise_on_error=True)
        assert results.attempted == 2  # the import and the example
