"""The provider contract: everything a provider package may use of vllm-ir core.

A provider package (``vllm-ir-cpu``, ``-triton``, ``-cuda``, ``-rocm``,
``-xpu``, or a third party's) imports only ``vllm_ir`` (ops and their
``register_impl``), this module, ``vllm_ir.ops`` and ``vllm_ir.testing``. The
repository enforces it with import-linter contracts (``.importlinter``), so
the rest of core can move without breaking providers. :data:`API_VERSION`
covers this module: a change that breaks it bumps the version.

What is here:

* declaring a provider package: :class:`ProviderSpec`, :class:`PlatformDefaults`,
  :data:`API_VERSION`; a platform of its own: :class:`Platform` (named by a
  ``vllm_ir.platforms`` entry point, or :func:`register_platform` in-process),
  :func:`device_type`, :func:`privateuse1_available`; its registrations:
  :class:`RegistrationHandle`, :class:`RegistrationLog`, :func:`recording_registrations`;
* infrastructure: :func:`get_logger`, :func:`current_platform`, :mod:`envs`
  (every environment variable, typed and validated),
  :func:`build_extension` / :class:`ExtensionBuildError` / :func:`cache_root`;
* layout predicates that never guard a compiled graph: :func:`contiguous`,
  :func:`rows_flatten_free`, :func:`may_overlap_itself`;
* tolerances: :class:`Tolerance` and the shared constants;
* ``supports_args`` builders for the norm family (:func:`norm_supports_args`)
  and the vendor-wrapper helper (:class:`VendorNorm`) that vendor packages
  configure from a table.

>>> import torch
>>> from vllm_ir.provider import norm_supports_args
>>> rms, fused = norm_supports_args("cpu", (torch.float32,))
>>> x, w = torch.randn(4, 8), torch.ones(8)
>>> rms(x, w, 1e-6), rms(x, w, 1e-6, variance_size=4), rms(x.half(), w, 1e-6)
(True, False, False)
>>> fused(x, torch.randn(4, 8), w, 1e-6)
True
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from vllm_ir import envs
from vllm_ir._version import API_VERSION
from vllm_ir.impl import NATIVE
from vllm_ir.layout import contiguous, may_overlap_itself, rows_flatten_free
from vllm_ir.logger import get_logger
from vllm_ir.platform import Platform, current_platform, device_type, privateuse1_available
from vllm_ir.priority import PlatformDefaults
from vllm_ir.providers import ProviderSpec, register_platform
from vllm_ir.registration import RegistrationHandle, RegistrationLog, recording_registrations
from vllm_ir.samples import SampleInput
from vllm_ir.tolerances import (
    DEFAULT_TOLERANCES,
    EXACT,
    FP8_DYNAMIC_SCALE,
    FP8_ONE_STEP,
    NORM_TOLERANCES,
    Tolerance,
    fp8_steps_apart,
)

if TYPE_CHECKING:
    from vllm_ir.extension import ExtensionBuildError, cache_root

__all__ = [
    "API_VERSION",
    "DEFAULT_TOLERANCES",
    "EXACT",
    "FP8_DYNAMIC_SCALE",
    "FP8_ONE_STEP",
    "NATIVE",
    "NORM_TOLERANCES",
    "ExtensionBuildError",
    "Platform",
    "PlatformDefaults",
    "ProviderSpec",
    "RegistrationHandle",
    "RegistrationLog",
    "SampleInput",
    "Tolerance",
    "VendorNorm",
    "build_extension",
    "cache_root",
    "contiguous",
    "current_platform",
    "device_type",
    "envs",
    "fp8_steps_apart",
    "get_logger",
    "may_overlap_itself",
    "norm_supports_args",
    "privateuse1_available",
    "recording_registrations",
    "register_platform",
    "rows_flatten_free",
]

TensorCheck = Callable[..., bool]


def build_extension(*args: Any, **kwargs: Any) -> Any:
    """:func:`vllm_ir.extension.build_extension`: compile and load a C++/CUDA extension, cached.

    Imported on first use (importing a provider package builds nothing), and
    looked up per call, so replacing ``vllm_ir.extension.build_extension``
    (a test's fake build) reaches here too.
    """
    from vllm_ir import extension

    return extension.build_extension(*args, **kwargs)


def __getattr__(name: str) -> Any:
    # the kernel-build module loads on first use: a provider package's import stays light
    if name in ("ExtensionBuildError", "cache_root"):
        from vllm_ir import extension

        return getattr(extension, name)
    raise AttributeError(f"module 'vllm_ir.provider' has no attribute {name!r}")


def norm_supports_args(
    device_types: str | Iterable[str],
    dtypes: Iterable[torch.dtype],
    *,
    rms_layout: Callable[[Tensor], bool] | None = None,
    fused_layout: Callable[[Tensor, Tensor], bool] | None = None,
    available: Callable[[], bool] | None = None,
) -> tuple[TensorCheck, TensorCheck]:
    """``(rms_norm_supports, fused_add_rms_norm_supports)`` for one kind of kernel.

    Both accept strided ``x`` of rank >= 1 on one of ``device_types`` with a
    dtype in ``dtypes``, a weight of ``x``'s dtype and rank 1 (or none), and no
    ``variance_size``; ``fused_add_rms_norm`` also wants ``x_residual`` of
    ``x``'s dtype and rank. ``rms_layout(x)`` and ``fused_layout(x, x_residual)``
    add what the kernel needs of the layout (use the predicates of this module,
    which never guard); ``available()`` is asked last (a kernel that is built on
    first use, say).
    """
    devices = frozenset([device_types] if isinstance(device_types, str) else device_types)
    accepted = frozenset(dtypes)

    def tensors_ok(x: Tensor, weight: Tensor | None) -> bool:
        return (
            x.device.type in devices
            and x.dtype in accepted
            and x.layout == torch.strided
            and x.ndim >= 1
            and (weight is None or (weight.dtype == x.dtype and weight.ndim == 1))
        )

    def rms_norm_supports(
        x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
    ) -> bool:
        return (
            variance_size is None
            and tensors_ok(x, weight)
            and (rms_layout is None or rms_layout(x))
            and (available is None or available())
        )

    def fused_add_rms_norm_supports(
        x: Tensor,
        x_residual: Tensor,
        weight: Tensor | None,
        epsilon: float,
        variance_size: int | None = None,
    ) -> bool:
        return (
            variance_size is None
            and x_residual.dtype == x.dtype
            and x_residual.ndim == x.ndim
            and tensors_ok(x, weight)
            and (fused_layout is None or fused_layout(x, x_residual))
            and (available is None or available())
        )

    return rms_norm_supports, fused_add_rms_norm_supports


class _Availability(Protocol):
    """What :class:`VendorNorm` reads of a vendor package's availability probe."""

    @property
    def supported(self) -> bool: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def device_type(self) -> str: ...
    @property
    def hardware(self) -> bool: ...
    @property
    def vendor_version(self) -> str | None: ...


@dataclass(frozen=True)
class VendorNorm:
    """The shared part of a vendor library's ``rms_norm``/``fused_add_rms_norm`` wrappers.

    Vendor norm kernels (AITER on ROCm, vllm-xpu-kernels on XPU) differ only in
    the names below; the wiring around them is this class.

    Attributes:
        provider: the default provider name the impls register under.
        library: how log lines name the vendor library (``"AITER"``).
        lacks: the end of the ``variance_size`` error, after "which"
            (``"AITER does not support"``).
        dtypes: the activation dtypes the kernels accept.
        fused_layout: what the in-place kernel needs of ``(x, x_residual)``.
        rms_layout: what the out-of-place kernel needs of ``x``.
    """

    provider: str
    library: str
    lacks: str
    dtypes: tuple[torch.dtype, ...]
    fused_layout: Callable[[Tensor, Tensor], bool]
    rms_layout: Callable[[Tensor], bool] = rows_flatten_free

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
            # Declined by supports_args (dispatch never sends it here), but the impl
            # is a public function: the kernel got x as contiguous rows; lay the
            # result out like the native function would.
            return torch.empty_like(x).copy_(out)

        def fused_add_rms_norm(
            x: Tensor,
            x_residual: Tensor,
            weight: Tensor | None,
            epsilon: float,
            variance_size: int | None = None,
        ) -> tuple[Tensor, Tensor]:
            kit.no_variance_size("fused_add_rms_norm", variance_size)
            kernels.fused_add_rms_norm(x, x_residual, kit.weight(weight, x), epsilon)
            return x, x_residual

        for fn, doc in ((rms_norm, rms_doc), (fused_add_rms_norm, fused_doc)):
            fn.__module__ = module  # the impl's package, for attribution and reprs
            fn.__qualname__ = fn.__name__
            fn.__doc__ = doc
        return rms_norm, fused_add_rms_norm

    def supports_args_for(self, device_type: str) -> tuple[TensorCheck, TensorCheck]:
        """The impls' ``supports_args`` for tensors on ``device_type``."""

        def fused_layout(x: Tensor, x_residual: Tensor) -> bool:
            return x_residual.layout == torch.strided and self.fused_layout(x, x_residual)

        return norm_supports_args(
            device_type, self.dtypes, rms_layout=self.rms_layout, fused_layout=fused_layout
        )

    def log_availability(self, provider: str, found: _Availability) -> None:
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

    def register(
        self,
        provider: str,
        found: _Availability,
        rms_norm: Callable[..., Any],
        fused_add_rms_norm: Callable[..., Any],
    ) -> None:
        """Register both impls, ``supported`` as ``found`` says."""
        from vllm_ir import ops

        rms_supports, fused_supports = self.supports_args_for(found.device_type)
        ops.rms_norm.register_impl(
            provider,
            supported=found.supported,
            supports_args=rms_supports,
            unsupported_reason=found.reason,
        )(rms_norm)
        ops.fused_add_rms_norm.register_impl(
            provider,
            supported=found.supported,
            supports_args=fused_supports,
            inplace=True,
            unsupported_reason=found.reason,
        )(fused_add_rms_norm)
