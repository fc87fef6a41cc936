"""The ``cpu_c`` impls of the IR ops, and when they apply.

Ops: ``rms_norm``, ``fused_add_rms_norm`` (in place), their vLLM numerics
``vllm_rms_norm`` (the ``rms_norm`` kernel: equal for a weight of ``x``'s
dtype, the only weight the norms accept) and ``vllm_fused_add_rms_norm`` (in
place), ``silu_and_mul``,
``gelu_and_mul``, ``rotary_embedding`` and ``rotary_embedding_fp32`` (in place:
into ``query`` and ``key``),
``static_scaled_fp8_quant``, ``dynamic_per_token_fp8_quant``,
``rms_norm_static_fp8_quant`` and ``fused_add_rms_norm_static_fp8_quant``
(in place: the new residual goes into ``x_residual``; the FP8 output is new).

Each impl has exactly its op's native signature (``register_impl`` checks).
They call the kernel ops of :mod:`vllm_ir_cpu.library`, building the C++
library on the first call: a real call, or the lowering tracing the impl on
FakeTensors, so a compiled model has its kernels before it first runs.

``supports_args`` may only look at argument metadata that dispatch caches on
(dtype, ndim, device, layout, non-tensor arguments), never at sizes or
strides. So the kernels take any layout: rows may be strided as long as the
last dimension is contiguous, and any other layout goes through contiguous
copies inside the kernel. What they decline, falling back to the next
provider (``native`` at the latest):

* ``variance_size`` (the partial-variance variant);
* dtypes of ``x`` other than float32, bfloat16, float16; non-CPU or
  non-strided tensors; a 0-d ``x``;
* for the norms, a weight whose dtype differs from ``x``'s (native promotes
  the product; the kernels write the input dtype), or that is not 1-D;
* for ``fused_add_rms_norm`` and its quantized variant: an ``x_residual``
  whose dtype or rank differs from ``x``'s (native broadcasts or promotes; in
  place, the sum must fit ``x_residual``);
* for the FP8 ops: a ``scale`` (or ``scale_ub``) that is not a float32 CPU
  tensor of at most one dimension (native would promote or broadcast); its
  one element is checked by the kernel, which cannot be declined on sizes;
* for ``silu_and_mul``: nothing more; an odd last dimension is the op's
  ``ValueError`` (:func:`vllm_ir.ops.activation.check_gated_width`), raised by
  the impl before any kernel runs, as by native and every provider (the
  kernel keeps its own check);
* for ``gelu_and_mul``: an ``approximate`` other than ``"none"`` and
  ``"tanh"`` (native raises on it); an odd last dimension as for ``silu_and_mul``;
* for ``rotary_embedding`` and ``rotary_embedding_fp32``: tensors of
  different dtypes (native promotes), a ``query`` or ``key`` of rank below 2,
  or ``cos``/``sin`` of rank 0, of different ranks, or of more dims than
  ``query[..., 0]`` (native would broadcast the output over them). An odd
  or too large ``rotary_dim`` (``cos.size(-1)``) is an error in the kernel,
  as it is in native but for an odd one in neox style, which native computes
  and no model uses;
* any call, when this machine has no C++ compiler or ninja and the library
  is not loaded yet (logged once).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import vllm_ir as ir
from torch import Tensor
from vllm_ir.kits.norms import fused_add_in_place, norm_supports_args, register_norm_impls
from vllm_ir.ops.activation import GELU_APPROXIMATIONS, check_gated_width
from vllm_ir.provider import current_platform, get_logger

from vllm_ir_cpu import PROVIDER, build
from vllm_ir_cpu.library import kernel_ops

__all__ = [
    "DTYPES",
    "dynamic_per_token_fp8_quant",
    "fused_add_rms_norm",
    "fused_add_rms_norm_static_fp8_quant",
    "gelu_and_mul",
    "register_impls",
    "rms_norm",
    "rms_norm_static_fp8_quant",
    "rotary_embedding",
    "rotary_embedding_fp32",
    "silu_and_mul",
    "static_scaled_fp8_quant",
    "vllm_fused_add_rms_norm",
]

__vllm_ir_caches__ = ("_built", "_warned_toolchain")
"""Built or loaded on first use: not part of the impls' code fingerprint."""

DTYPES = frozenset({torch.float32, torch.bfloat16, torch.float16})
"""The dtypes the kernels compute in."""

logger = get_logger("vllm_ir.cpu_c")

_OPS = kernel_ops()
_rms_norm_kernel = _OPS["rms_norm_functional"]
_fused_add_rms_norm_kernel = _OPS["fused_add_rms_norm"]
_vllm_fused_add_rms_norm_kernel = _OPS["vllm_fused_add_rms_norm"]
_silu_and_mul_kernel = _OPS["silu_and_mul"]
_gelu_and_mul_kernel = _OPS["gelu_and_mul"]
_rotary_kernel = _OPS["rotary_embedding"]
_rotary_fp32_kernel = _OPS["rotary_embedding_fp32"]
_static_quant_kernel = _OPS["static_scaled_fp8_quant"]
_dynamic_quant_kernel = _OPS["dynamic_per_token_fp8_quant"]
_rms_norm_quant_kernel = _OPS["rms_norm_static_fp8_quant"]
_fused_add_rms_norm_quant_kernel = _OPS["fused_add_rms_norm_static_fp8_quant"]

_built = False


def _ensure_built() -> None:
    global _built
    build.build()
    _built = True


def rms_norm(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    if not _built:
        _ensure_built()
    return _rms_norm_kernel(x, weight, epsilon)


def _in_place(kernel: torch._ops.OpOverload) -> Callable[..., None]:
    """The call ``fused_add_in_place`` wraps: the library built first, then ``kernel``."""

    def call(
        x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, variance_size: object
    ) -> None:
        if not _built:
            _ensure_built()
        kernel(x, x_residual, weight, epsilon)

    return call


fused_add_rms_norm = fused_add_in_place(
    _in_place(_fused_add_rms_norm_kernel),
    module=__name__,
    doc="In place: the rounded sum goes into ``x_residual``, the normalized output into ``x``.",
)
vllm_fused_add_rms_norm = fused_add_in_place(
    _in_place(_vllm_fused_add_rms_norm_kernel),
    module=__name__,
    name="vllm_fused_add_rms_norm",
    doc="In place: the rounded sum goes into ``x_residual``, the normalized fp32 sum into ``x``.",
)


def silu_and_mul(x: Tensor) -> Tensor:
    check_gated_width("silu_and_mul", x)  # an odd width: the op's error, before any kernel
    if not _built:
        _ensure_built()
    return _silu_and_mul_kernel(x)


def gelu_and_mul(x: Tensor, approximate: str = "none") -> Tensor:
    check_gated_width("gelu_and_mul", x)  # an odd width: the op's error, before any kernel
    if not _built:
        _ensure_built()
    return _gelu_and_mul_kernel(x, approximate)


def _rotary_in_place(kernel: torch._ops.OpOverload, name: str, doc: str) -> Callable[..., Any]:
    """A RoPE impl: the library built first, then ``kernel`` into ``query`` and ``key``."""

    def impl(
        query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool = True
    ) -> tuple[Tensor, Tensor]:
        if not _built:
            _ensure_built()
        kernel(query, key, cos, sin, is_neox)
        return query, key

    impl.__name__ = impl.__qualname__ = name
    impl.__doc__ = doc
    return impl


rotary_embedding = _rotary_in_place(
    _rotary_kernel, "rotary_embedding", "In place: the rotated channels go into query and key."
)
rotary_embedding_fp32 = _rotary_in_place(
    _rotary_fp32_kernel,
    "rotary_embedding_fp32",
    "In place, as rotary_embedding; each output rounded once from fp32.",
)


def static_scaled_fp8_quant(x: Tensor, scale: Tensor) -> Tensor:
    if not _built:
        _ensure_built()
    return _static_quant_kernel(x, scale)


def dynamic_per_token_fp8_quant(x: Tensor, scale_ub: Tensor | None = None) -> tuple[Tensor, Tensor]:
    if not _built:
        _ensure_built()
    q, scales = _dynamic_quant_kernel(x, scale_ub)
    return q, scales


def rms_norm_static_fp8_quant(
    x: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> Tensor:
    if not _built:
        _ensure_built()
    return _rms_norm_quant_kernel(x, weight, epsilon, scale)


def fused_add_rms_norm_static_fp8_quant(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> tuple[Tensor, Tensor]:
    # In place: the rounded sum goes into x_residual; the FP8 output is a new
    # tensor (it cannot reuse x, of another dtype), and x is left as it was.
    if not _built:
        _ensure_built()
    q = _fused_add_rms_norm_quant_kernel(x, x_residual, weight, epsilon, scale)
    return q, x_residual


_warned_toolchain = False


def _buildable() -> bool:
    if build.is_loaded():
        return True
    # a build cache the build would refuse (another user's, world-writable): the
    # call would fail, so selection falls back instead
    from vllm_ir.provider import cache_problem  # the build module: on first use

    problem = build.toolchain_problem() or cache_problem()
    if problem is None:
        return True
    global _warned_toolchain
    if not _warned_toolchain:
        _warned_toolchain = True
        logger.warning("%s kernels cannot be built, so they are skipped: %s", PROVIDER, problem)
    return False


def _input_ok(x: Tensor) -> bool:
    return (
        x.device.type == "cpu" and x.layout == torch.strided and x.dtype in DTYPES and x.ndim >= 1
    )


def _kernel_can_run(x: Tensor, weight: Tensor | None) -> bool:
    return (
        _input_ok(x)
        and (weight is None or (weight.dtype == x.dtype and weight.ndim == 1))
        and _buildable()
    )


def _scale_ok(scale: Tensor) -> bool:
    # one fp32 element; its size (numel 1) is the kernel's to check
    return (
        scale.device.type == "cpu"
        and scale.layout == torch.strided
        and scale.dtype == torch.float32
        and scale.ndim <= 1
    )


_norm_supported = norm_supports_args("cpu", DTYPES, available=_buildable)


def _silu_and_mul_supported(x: Tensor) -> bool:
    return _input_ok(x) and _buildable()


def _gelu_and_mul_supported(x: Tensor, approximate: str = "none") -> bool:
    return _input_ok(x) and approximate in GELU_APPROXIMATIONS and _buildable()


def _rotary_supported(
    query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool = True
) -> bool:
    return (
        _input_ok(query)
        and all(
            t.device.type == "cpu" and t.layout == torch.strided and t.dtype == query.dtype
            for t in (key, cos, sin)
        )
        and min(query.ndim, key.ndim) >= 2
        and 1 <= cos.ndim == sin.ndim < min(query.ndim, key.ndim)
        and _buildable()
    )


def _static_quant_supported(x: Tensor, scale: Tensor) -> bool:
    return _input_ok(x) and _scale_ok(scale) and _buildable()


def _dynamic_quant_supported(x: Tensor, scale_ub: Tensor | None = None) -> bool:
    return _input_ok(x) and (scale_ub is None or _scale_ok(scale_ub)) and _buildable()


def _rms_norm_quant_supported(
    x: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> bool:
    return _scale_ok(scale) and _kernel_can_run(x, weight)


def _fused_add_rms_norm_quant_supported(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> bool:
    return (
        x_residual.dtype == x.dtype
        and x_residual.ndim == x.ndim
        and _scale_ok(scale)
        and _kernel_can_run(x, weight)
    )


def register_impls() -> None:
    """Register every ``cpu_c`` impl; called by vllm-ir through the ProviderSpec."""
    # C++ CPU kernels: offered where CPU is the platform whose defaults apply
    supported = current_platform() == "cpu"
    # each row is computed alone, by the same code whatever the batch: batch invariant
    register_norm_impls(
        PROVIDER,
        rms_norm,
        fused_add_rms_norm,
        supported=supported,
        supports_args=_norm_supported,
        batch_invariant=True,
        vllm_fused_add_rms_norm=vllm_fused_add_rms_norm,
    )
    # each row (for rotary_embedding each (token, head) row) is computed alone,
    # elementwise or by the same code whatever the batch: batch invariant. In place
    # (inplace=True): rotary_embedding rotates query and key, the fused quant writes
    # x_residual; the others return new outputs and only read their inputs.
    for op, fn, supports, inplace in (
        (ir.ops.silu_and_mul, silu_and_mul, _silu_and_mul_supported, False),
        (ir.ops.gelu_and_mul, gelu_and_mul, _gelu_and_mul_supported, False),
        (ir.ops.static_scaled_fp8_quant, static_scaled_fp8_quant, _static_quant_supported, False),
        (
            ir.ops.dynamic_per_token_fp8_quant,
            dynamic_per_token_fp8_quant,
            _dynamic_quant_supported,
            False,
        ),
        (
            ir.ops.rms_norm_static_fp8_quant,
            rms_norm_static_fp8_quant,
            _rms_norm_quant_supported,
            False,
        ),
        (ir.ops.rotary_embedding, rotary_embedding, _rotary_supported, True),
        (ir.ops.rotary_embedding_fp32, rotary_embedding_fp32, _rotary_supported, True),
        (
            ir.ops.fused_add_rms_norm_static_fp8_quant,
            fused_add_rms_norm_static_fp8_quant,
            _fused_add_rms_norm_quant_supported,
            True,
        ),
    ):
        op.register_impl(
            PROVIDER,
            inplace=inplace,
            supported=supported,
            supports_args=supports,
            batch_invariant=True,
        )(fn)
