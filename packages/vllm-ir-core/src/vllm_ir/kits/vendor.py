"""The vendor-wrapper helper: one table per vendor norm library, the wiring shared.

Vendor packages (vllm-ir-rocm over AMD's AITER, vllm-ir-xpu over
vllm-xpu-kernels) wrap a vendor's RMSNorm kernels the same way; only names,
dtypes, layouts and the calls into the library differ. A package fills in a
:class:`VendorNorm` and gets from it:

* the opaque torch ops over the kernels, with fake impls (:meth:`VendorNorm.define_ops`);
* the ``rms_norm``/``fused_add_rms_norm`` impls with the ops' native
  signatures: the ones weight for ``weight=None``, ``variance_size`` refused
  (:meth:`VendorNorm.impls`), and their ``supports_args`` (:meth:`VendorNorm.supports_args_for`);
* the registration and its log line (:meth:`VendorNorm.register_kernels`);
* the ``python -m <package>`` report (:meth:`VendorNorm.main`).

The availability probe keeps its vendor-specific checks; what is common is
here: the answer (:class:`VendorAvailability`), computed once per process and
forceable by tests (:class:`AvailabilityCache`), and importing the vendor
module without letting a broken install break vllm-ir (:func:`import_vendor`).
Everything is public through :mod:`vllm_ir.provider`.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor

from vllm_ir._base.logger import get_logger
from vllm_ir._discovery.providers import ProviderSpec
from vllm_ir._schema.layout import rows_flatten_free
from vllm_ir.kits.norms import (
    TensorCheck,
    fused_add_in_place,
    norm_supports_args,
    register_norm_impls,
)
from vllm_ir.priority import PlatformDefaults

__all__ = [
    "AvailabilityCache",
    "VendorAvailability",
    "VendorNorm",
    "import_vendor",
    "rows_view",
    "unsupported_reason_attribute",
    "vendor_provider_spec",
]

NORM_OPS = ("rms_norm", "fused_add_rms_norm")
"""The ops a vendor norm package implements."""


def vendor_provider_spec(
    provider: str,
    *,
    api_version: int,
    register: Callable[[], object],
    platform: str,
    eager: Sequence[str],
    rank: int,
) -> ProviderSpec:
    """The ``ProviderSpec`` of a vendor norm package (its ``vllm_ir.providers`` entry point).

    On ``platform`` both norm ops list ``eager`` in eager mode and
    Dynamo-only compilation, at ``rank``; under Inductor ``native`` comes
    first (Inductor fuses it; an opaque kernel is a fusion barrier).
    ``register`` should import the impls only when called
    (:func:`vllm_ir.provider.deferred_register`).

    >>> spec = vendor_provider_spec(
    ...     "acme", api_version=1, register=lambda: None, platform="cuda", eager=["acme"], rank=50
    ... )
    >>> spec.defaults[0].eager["fused_add_rms_norm"], spec.defaults[0].compiled["rms_norm"]
    (['acme'], ['native'])
    """
    defaults = PlatformDefaults(
        platform,
        eager={op: list(eager) for op in NORM_OPS},
        compiled={op: ["native"] for op in NORM_OPS},
        rank=rank,
    )
    return ProviderSpec(
        name=provider, api_version=api_version, register=register, defaults=(defaults,)
    )


def unsupported_reason_attribute(package: str, availability: str) -> Callable[[str], object]:
    """A module ``__getattr__`` serving ``UNSUPPORTED_REASON`` from ``availability.current()``.

    Computed on first access (on the vendor's machine that imports the
    vendor library), not when the package is imported.
    """

    def __getattr__(name: str) -> object:
        if name == "UNSUPPORTED_REASON":
            return importlib.import_module(availability).current().reason
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


@dataclass(frozen=True)
class VendorAvailability:
    """Whether a vendor package's impls can run in this process, and if not, why.

    A package subclasses it to give ``device_type`` its platform's default.

    Attributes:
        supported: the impls can run here.
        reason: why they cannot (``None`` when supported).
        device_type: the device type of the tensors the impls accept.
        hardware: torch sees the GPU; when the impls are unsupported all the
            same, the vendor library is missing or broken (worth a warning).
        vendor_version: the vendor library's version, when known.
    """

    supported: bool
    reason: str | None = None
    device_type: str = "cpu"
    hardware: bool = False
    vendor_version: str | None = None


A = TypeVar("A", bound=VendorAvailability)


class AvailabilityCache(Generic[A]):
    """A probe's answer, computed on first use and kept; tests may force another.

    >>> cache = AvailabilityCache(lambda: VendorAvailability(False, "no GPU"))
    >>> cache.current().reason
    'no GPU'
    >>> with cache.forced(VendorAvailability(True)):
    ...     cache.current().supported
    True
    """

    def __init__(self, probe: Callable[[], A]) -> None:
        self._probe = probe
        self._detected: A | None = None
        self._forced: A | None = None

    def current(self) -> A:
        """The probe's answer for this process (or the forced one)."""
        if self._forced is not None:
            return self._forced
        if self._detected is None:
            self._detected = self._probe()
        return self._detected

    @contextlib.contextmanager
    def forced(self, availability: A) -> Iterator[A]:
        """Testing hook: :meth:`current` answers ``availability`` inside the block.

        Lets the wiring be tested without the vendor's GPU, over stand-in
        kernels on CPU tensors (``supported=True, device_type="cpu"``). It
        changes only what is registered inside the block.
        """
        previous = self._forced
        self._forced = availability
        try:
            yield availability
        finally:
            self._forced = previous


def import_vendor(
    module: str, *, not_installed: str, package: str | None = None, shown: str | None = None
) -> ModuleType | str:
    """``module`` imported (or already in ``sys.modules``), or why it could not be.

    ``package`` is what must be installed (default: ``module``); the reason is
    ``not_installed`` when it is not, and ``importing <shown> failed: ...``
    when the import raises (``shown`` defaults to ``repr(module)``): a broken
    vendor install must not break vllm-ir, so every exception is caught.

    >>> import_vendor("no_such_vendor_library", not_installed="not here")
    'not here'
    """
    found = sys.modules.get(module)
    if found is not None:
        return found
    try:
        present = importlib.util.find_spec(package or module) is not None
    except (ImportError, ValueError):
        present = False
    if not present:
        return not_installed
    try:
        return importlib.import_module(module)
    except Exception as e:
        return f"importing {shown or repr(module)} failed: {type(e).__name__}: {e}"


def rows_view(t: Tensor) -> Tensor | None:
    """``t`` as a ``(-1, hidden)`` view with unit-stride rows, or ``None`` if that needs a copy.

    >>> rows_view(torch.empty(2, 3, 8)).shape, rows_view(torch.empty(8, 4).t())
    (torch.Size([6, 8]), None)
    """
    hidden = t.shape[-1]
    if t.stride(-1) != 1 and hidden > 1:
        return None
    try:
        return t.view(-1, hidden)
    except RuntimeError:  # the leading dimensions do not flatten to one stride
        return None


RmsRows = Callable[[Tensor, Tensor, float], Tensor]
"""``(rows, weight, epsilon) -> out_rows``: a vendor call on ``(-1, hidden)`` rows."""
FusedRows = Callable[[Tensor, Tensor, Tensor, float], None]
"""``(x_rows, residual_rows, weight, epsilon)``: the in-place vendor call."""


@dataclass(frozen=True)
class VendorNorm:
    """The shared part of a vendor library's ``rms_norm``/``fused_add_rms_norm`` wrappers.

    Vendor norm kernels (AITER on ROCm, vllm-xpu-kernels on XPU) differ only in
    the names below; the wiring around them is this class.

    Attributes:
        provider: the default provider name the impls register under.
        library: how log lines and reports name the vendor library (``"AITER"``).
        lacks: the end of the ``variance_size`` error, after "which"
            (``"AITER does not support"``).
        dtypes: the activation dtypes the kernels accept.
        fused_layout: what the in-place kernel needs of ``(x, x_residual)``.
        rms_layout: what the out-of-place kernel needs of ``x``.
        namespace: the ``torch.library`` namespace of the opaque ops (the package).
        takes: how dtype errors name the kernels, before the dtype list
            (``"AITER's RMSNorm takes"``).
    """

    provider: str
    library: str
    lacks: str
    dtypes: tuple[torch.dtype, ...]
    fused_layout: Callable[[Tensor, Tensor], bool]
    rms_layout: Callable[[Tensor], bool] = rows_flatten_free
    namespace: str = ""
    takes: str = ""

    @staticmethod
    def weight(weight: Tensor | None, x: Tensor) -> Tensor:
        """``weight``, or ones of ``x``'s hidden size: the kernels always multiply by one."""
        if weight is None:
            return torch.ones(x.shape[-1], dtype=x.dtype, device=x.device)
        return weight

    def no_variance_size(self, op: str, variance_size: int | None) -> None:
        """Refuse ``variance_size`` (the kernels normalize the whole last dimension)."""
        if variance_size is not None:
            raise ValueError(
                f"the {self.provider} impl of {op} got variance_size={variance_size}, which "
                f"{self.lacks}; its supports_args declines such calls"
            )

    def check(self, op: str, x: Tensor, others: dict[str, Tensor]) -> None:
        """Dtype and device checks of an opaque op, valid for FakeTensors (no sizes read)."""
        where = f"{self.namespace}::{op}"
        if x.dtype not in self.dtypes:
            raise RuntimeError(
                f"{where}: x has dtype {x.dtype}; {self.takes} {', '.join(map(str, self.dtypes))}"
            )
        if x.dim() == 0:
            raise RuntimeError(f"{where}: x must have at least one dimension")
        for name, t in others.items():
            if t.dtype != x.dtype:
                raise RuntimeError(f"{where}: {name} has dtype {t.dtype} but x has dtype {x.dtype}")
            if t.device != x.device:
                raise RuntimeError(f"{where}: {name} is on {t.device} but x is on {x.device}")

    def define_ops(self, rms_rows: RmsRows, fused_rows: FusedRows) -> tuple[Any, Any]:
        """``torch.ops.<namespace>.rms_norm`` and ``.fused_add_rms_norm`` over the vendor calls.

        One opaque node per call for tracing, ``torch.compile`` and the
        lowering, with fake impls that never touch the vendor library.
        ``rms_rows`` gets ``x`` as unit-stride rows (a view when that is free,
        else a contiguous copy) and returns the normalized rows;
        ``fused_rows`` writes both its row arguments, which are views of ``x``
        and ``x_residual`` when :attr:`fused_layout` accepts them, else
        contiguous copies that are written back. Empty inputs never reach the
        vendor calls; weights are made contiguous.
        """
        kit = self

        @torch.library.custom_op(f"{self.namespace}::rms_norm", mutates_args=())
        def rms_norm(x: Tensor, weight: Tensor, epsilon: float) -> Tensor:
            """RMSNorm of ``x`` over its last dimension, times ``weight``: a new tensor."""
            kit.check("rms_norm", x, {"weight": weight})
            if x.numel() == 0:
                return x.new_empty(x.shape)
            rows = rows_view(x)
            if rows is None:
                rows = x.reshape(-1, x.shape[-1]).contiguous()
            out = rms_rows(rows, weight.contiguous(), epsilon)
            return out.reshape(x.shape).contiguous()

        @rms_norm.register_fake
        def _rms_norm_fake(x: Tensor, weight: Tensor, epsilon: float) -> Tensor:
            kit.check("rms_norm", x, {"weight": weight})
            return x.new_empty(x.shape)

        @torch.library.custom_op(
            f"{self.namespace}::fused_add_rms_norm", mutates_args=("x", "x_residual")
        )
        def fused_add_rms_norm(
            x: Tensor, x_residual: Tensor, weight: Tensor, epsilon: float
        ) -> None:
            """In place: ``x_residual += x`` (rounded), then ``x = rms_norm(x_residual)``."""
            kit.check("fused_add_rms_norm", x, {"x_residual": x_residual, "weight": weight})
            if x.shape != x_residual.shape:
                where = f"{kit.namespace}::fused_add_rms_norm"
                raise RuntimeError(
                    f"{where}: x has shape {tuple(x.shape)} but x_residual has "
                    f"{tuple(x_residual.shape)}; the in-place kernel needs equal shapes"
                )
            if x.numel() == 0:
                return
            weight = weight.contiguous()
            x_rows = rows_view(x) if kit.fused_layout(x, x_residual) else None
            if x_rows is not None:
                fused_rows(x_rows, x_residual.view(x_rows.shape), weight, epsilon)
                return
            hidden = x.shape[-1]
            x_rows = x.contiguous().view(-1, hidden)
            residual_rows = x_residual.contiguous().view(-1, hidden)
            fused_rows(x_rows, residual_rows, weight, epsilon)
            x.copy_(x_rows.view(x.shape))
            x_residual.copy_(residual_rows.view(x.shape))

        @fused_add_rms_norm.register_fake
        def _fused_add_rms_norm_fake(
            x: Tensor, x_residual: Tensor, weight: Tensor, epsilon: float
        ) -> None:
            kit.check("fused_add_rms_norm", x, {"x_residual": x_residual, "weight": weight})

        return rms_norm, fused_add_rms_norm

    def impls(
        self, kernels: Any, *, module: str, rms_doc: str, fused_doc: str
    ) -> tuple[Callable[..., Tensor], Callable[..., tuple[Tensor, Tensor]]]:
        """The ``rms_norm`` and in-place ``fused_add_rms_norm`` impls over ``kernels``.

        ``kernels`` has ``rms_norm(x, weight, epsilon)`` (returns the result)
        and ``fused_add_rms_norm(x, x_residual, weight, epsilon)`` (writes
        both), looked up per call. The functions are credited to ``module``
        (their package) and documented by ``rms_doc`` / ``fused_doc``.
        """
        kit = self

        def rms_norm(
            x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
        ) -> Tensor:
            kit.no_variance_size("rms_norm", variance_size)
            out: Tensor = kernels.rms_norm(x, kit.weight(weight, x), epsilon)
            if kit.rms_layout(x):
                return out
            # Declined by supports_args (selection never sends it here), but the impl
            # is a public function: the kernel got x as contiguous rows; lay the
            # result out like the native function would.
            return torch.empty_like(x).copy_(out)

        def fused_kernel(
            x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, variance: Any
        ) -> None:
            kit.no_variance_size("fused_add_rms_norm", variance)
            kernels.fused_add_rms_norm(x, x_residual, kit.weight(weight, x), epsilon)

        rms_norm.__module__ = module  # the impl's package, for attribution and reprs
        rms_norm.__qualname__ = rms_norm.__name__
        rms_norm.__doc__ = rms_doc
        return rms_norm, fused_add_in_place(fused_kernel, module=module, doc=fused_doc)

    def supports_args_for(self, device_type: str) -> tuple[TensorCheck, TensorCheck]:
        """``(rms_norm_supports, fused_add_rms_norm_supports)`` for tensors on ``device_type``.

        The registered predicates use the platform's device type; the CPU
        tests use ``cpu`` with stand-in kernels.
        """

        def fused_layout(x: Tensor, x_residual: Tensor) -> bool:
            return x_residual.layout == torch.strided and self.fused_layout(x, x_residual)

        return norm_supports_args(
            device_type, self.dtypes, rms_layout=self.rms_layout, fused_layout=fused_layout
        )

    def log_availability(self, provider: str, found: VendorAvailability) -> None:
        """Say at startup whether the impls run here; a warning only with the GPU present."""
        logger = get_logger(f"vllm_ir.providers.{provider}")
        if found.supported:
            logger.debug(
                f"provider %r: {self.library} %s found; impls registered for %s tensors",
                provider,
                found.vendor_version or "(version unknown)",
                found.device_type,
            )
            return
        # with the vendor's GPU, a missing or broken library is worth a warning;
        # elsewhere an unsupported vendor provider is the normal case
        level = logging.WARNING if found.hardware else logging.INFO
        logger.log(level, "provider %r registered as unsupported: %s", provider, found.reason)

    def register_kernels(
        self,
        provider: str,
        found: A,
        rms_norm: Callable[..., Any],
        fused_add_rms_norm: Callable[..., Any],
    ) -> A:
        """Log ``found``, then register both impls, ``supported`` as it says; returns it."""
        self.log_availability(provider, found)
        register_norm_impls(
            provider,
            rms_norm,
            fused_add_rms_norm,
            supported=found.supported,
            supports_args=self.supports_args_for(found.device_type),
            unsupported_reason=found.reason,
        )
        return found

    def main(
        self,
        argv: Sequence[str] | None,
        version: str,
        api_version: int,
        found: Callable[[], VendorAvailability],
        platform: Callable[[VendorAvailability], str],
    ) -> int:
        """``python -m <package>``: parse ``argv`` (``--help`` only), then :meth:`report`.

        ``found`` probes the vendor library (called after parsing, so ``--help``
        imports nothing); ``platform(found)`` says what torch sees.
        """
        import argparse

        argparse.ArgumentParser(
            prog=f"python -m {self.namespace}",
            description=f"Report whether the {self.provider} provider of vllm-ir can run here.",
        ).parse_args(argv)
        available = found()
        package = self.namespace.replace("_", "-")
        header = (
            f"{package} {version}: provider {self.provider!r}, vllm-ir provider API {api_version}"
        )
        return self.report(header, f"torch {torch.__version__}, {platform(available)}", available)

    def report(self, header: str, platform: str, found: VendorAvailability) -> int:
        """Print the ``python -m <package>`` report; 0 when the impls can run here, else 1.

        ``header`` names the package, provider and API version; ``platform``
        says what torch sees.
        """
        print(header)
        print(platform)
        if found.supported:
            print(
                f"supported: yes ({self.library} {found.vendor_version or 'version unknown'}, "
                f"{found.device_type} tensors)"
            )
            return 0
        print(f"supported: no: {found.reason}")
        return 1
