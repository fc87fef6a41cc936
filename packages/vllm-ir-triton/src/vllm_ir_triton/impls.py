"""The ``triton`` and ``triton_batch_invariant`` impls of the IR ops, and when they apply.

Both providers implement ``rms_norm`` and (in place) ``fused_add_rms_norm``, and
vLLM's numerics of the two, ``vllm_rms_norm`` (the ``rms_norm`` kernel) and (in
place) ``vllm_fused_add_rms_norm`` (the float32 sum normalized);
``triton`` also implements ``silu_and_mul``, ``gelu_and_mul``,
``rotary_embedding`` (in place, into ``query`` and ``key``), ``static_scaled_fp8_quant``,
``dynamic_per_token_fp8_quant``, ``rms_norm_static_fp8_quant`` and (writing
the new residual in place) ``fused_add_rms_norm_static_fp8_quant``.

Each impl has exactly its op's native signature (``register_impl`` checks).
A plain eager call launches the kernel directly (:mod:`vllm_ir_triton.launch`);
any other call — under ``make_fx`` (the vllm-ir lowering), Dynamo, a
dispatch mode, or with tensor subclasses — goes through the opaque torch ops
of :mod:`vllm_ir_triton.library`, so tracers record one node and never launch
a kernel. The direct launch saves the custom op's dispatcher round trip
(about 5 us a call on the eager hot path).

``supports_args`` looks only at what dispatch caches on (dtype, ndim, device,
layout, non-tensor arguments), never at sizes or strides. It declines, so
that selection falls back to the next provider (``native`` at the latest):

* ``variance_size`` (the partial-variance variant);
* dtypes other than float32, float16, bfloat16; non-strided tensors;
* tensors on a device the kernels do not run on (see :mod:`vllm_ir_triton.support`);
* a weight whose dtype differs from ``x``'s (native promotes the product; the
  kernels write the input dtype), or that is not 1-D;
* for ``fused_add_rms_norm`` (and its FP8 variant): an ``x_residual`` whose
  dtype or rank differs from ``x``'s;
* for the FP8 ops: a ``scale`` (or ``scale_ub``) that is not a float32 tensor
  of at most one dimension on ``x``'s device;
* for ``gelu_and_mul``: an ``approximate`` other than ``"none"`` or ``"tanh"``;
* for ``rotary_embedding``: tensors of different dtypes or devices, a
  ``query``/``key`` of rank below 2, ``cos``/``sin`` of different ranks or of
  more dims than ``query[..., 0]`` (native would broadcast the output).

What it cannot see, the impls handle themselves, computing the native
function instead of launching: a weight whose length is not the row length
(broadcasting), an ``x_residual`` whose shape differs from ``x``'s (a
broadcast sum cannot be written in place), a ``scale`` of more than one
element and rows of no elements for ``dynamic_per_token_fp8_quant`` (native's
broadcasting or error). An odd last dimension of ``silu_and_mul``'s or
``gelu_and_mul``'s ``x`` is an error for every impl: the impl raises the op's
``ValueError`` (:func:`vllm_ir.ops.activation.check_gated_width`) before any launch.
Strides never matter: the kernels take a row and a column stride, and inputs
whose leading dimensions do not collapse into rows are copied
(:mod:`vllm_ir_triton.launch`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import vllm_ir as ir
from torch import Tensor
from vllm_ir.kits.norms import norm_supports_args, register_norm_impls
from vllm_ir.ops.activation import check_gated_width
from vllm_ir.provider import get_logger

from vllm_ir_triton import BATCH_INVARIANT_PROVIDER, PROVIDER, launch, library, support

__all__ = [
    "DTYPES",
    "dynamic_per_token_fp8_quant",
    "fused_add_rms_norm",
    "vllm_fused_add_rms_norm",
    "vllm_fused_add_rms_norm_batch_invariant",
    "fused_add_rms_norm_batch_invariant",
    "fused_add_rms_norm_static_fp8_quant",
    "quant_supports_args_for",
    "register_impls",
    "rms_norm",
    "rms_norm_batch_invariant",
    "rms_norm_static_fp8_quant",
    "silu_and_mul",
    "gelu_and_mul",
    "rotary_embedding",
    "static_scaled_fp8_quant",
    "supports_args_for",
]

DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16})
"""The dtypes the kernels compute in (every tensor of a call shares one)."""

logger = get_logger("vllm_ir.triton")

_is_compiling = torch.compiler.is_compiling
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_rms_norm_op = library.rms_norm
_fused_add_rms_norm_op = library.fused_add_rms_norm_
_vllm_fused_add_rms_norm_op = library.vllm_fused_add_rms_norm_
_silu_and_mul_op = library.silu_and_mul
_gelu_and_mul_op = library.gelu_and_mul
_rotary_op = library.rotary_embedding_
_static_quant_op = library.static_scaled_fp8_quant
_dynamic_quant_op = library.dynamic_per_token_fp8_quant
_rms_norm_quant_op = library.rms_norm_static_fp8_quant
_fused_add_rms_norm_quant_op = library.fused_add_rms_norm_static_fp8_quant_


def _plain_eager(x: Tensor) -> bool:
    """A real tensor outside any tracer or mode: launch the kernel directly."""
    return type(x) is Tensor and not _dispatch_stack_len() and not _is_compiling()


def _known_equal(a: int | torch.SymInt, b: int | torch.SymInt) -> bool:
    """``a == b`` for sizes, without guarding on symbolic ones (unknown -> False)."""
    if type(a) is int and type(b) is int:
        return a == b
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(a == b)


def _one_element(scale: Tensor | None) -> bool:
    return scale is None or _known_equal(scale.numel(), 1)


def _nonempty_rows(x: Tensor) -> bool:
    hidden = x.shape[-1]
    if type(hidden) is int:
        return hidden > 0
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(hidden > 0)


def _weight_fits(x: Tensor, weight: Tensor | None) -> bool:
    return weight is None or _known_equal(weight.shape[0], x.shape[-1])


def _same_shape(a: Tensor, b: Tensor) -> bool:
    return a.dim() == b.dim() and all(
        _known_equal(m, n) for m, n in zip(a.shape, b.shape, strict=True)
    )


def _rms_norm(
    x: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None,
    batch_invariant: bool,
) -> Tensor:
    if variance_size is not None or not _weight_fits(x, weight):
        return ir.ops.rms_norm.native(x, weight, epsilon, variance_size)
    if _plain_eager(x):
        return launch.rms_norm(x, weight, epsilon, batch_invariant=batch_invariant)
    return _rms_norm_op(x, weight, epsilon, batch_invariant)


def _fused_add_rms_norm(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None,
    batch_invariant: bool,
    vllm: bool = False,
) -> tuple[Tensor, Tensor]:
    """``fused_add_rms_norm``, or with ``vllm`` ``vllm_fused_add_rms_norm`` (vLLM's numerics)."""
    if variance_size is not None or not _weight_fits(x, weight) or not _same_shape(x, x_residual):
        op = ir.ops.vllm_fused_add_rms_norm if vllm else ir.ops.fused_add_rms_norm
        return op.native(x, x_residual, weight, epsilon, variance_size)  # type: ignore[no-any-return]
    if _plain_eager(x):
        launch.fused_add_rms_norm_(
            x, x_residual, weight, epsilon, batch_invariant=batch_invariant, vllm=vllm
        )
    else:
        traced = _vllm_fused_add_rms_norm_op if vllm else _fused_add_rms_norm_op
        traced(x, x_residual, weight, epsilon, batch_invariant)
    return x, x_residual


def rms_norm(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    """``triton``: the row in one block when it fits, tuned per row length."""
    return _rms_norm(x, weight, epsilon, variance_size, False)


def fused_add_rms_norm(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``triton``, in place: the rounded sum into ``x_residual``, the result into ``x``."""
    return _fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size, False)


def vllm_fused_add_rms_norm(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``triton``, in place, vLLM's numerics: the float32 sum normalized into ``x``."""
    return _fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size, False, vllm=True)


def vllm_fused_add_rms_norm_batch_invariant(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``triton_batch_invariant``, in place, vLLM's numerics, the fixed configuration."""
    return _fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size, True, vllm=True)


def rms_norm_batch_invariant(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    """``triton_batch_invariant``: fixed block and warps, whatever the shapes."""
    return _rms_norm(x, weight, epsilon, variance_size, True)


def fused_add_rms_norm_batch_invariant(
    x: Tensor,
    x_residual: Tensor,
    weight: Tensor | None,
    epsilon: float,
    variance_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """``triton_batch_invariant``, in place, with the fixed configuration."""
    return _fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size, True)


def silu_and_mul(x: Tensor) -> Tensor:
    """``triton``: ``silu(x[..., :d]) * x[..., d:]``, one program per row."""
    check_gated_width("silu_and_mul", x)  # an odd width: the op's error, before any launch
    if _plain_eager(x):
        return launch.silu_and_mul(x)
    return _silu_and_mul_op(x)


def gelu_and_mul(x: Tensor, approximate: str = "none") -> Tensor:
    """``triton``: ``gelu(x[..., :d], approximate) * x[..., d:]``, one program per row."""
    check_gated_width("gelu_and_mul", x)  # an odd width: the op's error, before any launch
    if _plain_eager(x):
        return launch.gelu_and_mul(x, approximate)
    return _gelu_and_mul_op(x, approximate)


def _rotary_fits(query: Tensor, key: Tensor, cos: Tensor, sin: Tensor) -> bool:
    """Sizes native computes and the kernel does not: an odd or too wide rotary_dim."""
    rot, head = cos.shape[-1], query.shape[-1]
    return (
        _known_equal(rot % 2, 0)
        and _known_equal(sin.shape[-1], rot)
        and bool(rot <= head)
        and bool(rot <= key.shape[-1])
    )


def rotary_embedding(
    query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool = True
) -> tuple[Tensor, Tensor]:
    """``triton``, in place: RoPE of each (token, head) row of ``query`` and ``key``."""
    if not _rotary_fits(query, key, cos, sin):
        return ir.ops.rotary_embedding.native(query, key, cos, sin, is_neox)
    if _plain_eager(query):
        launch.rotary_embedding_(query, key, cos, sin, is_neox)
    else:
        _rotary_op(query, key, cos, sin, is_neox)
    return query, key


def static_scaled_fp8_quant(x: Tensor, scale: Tensor) -> Tensor:
    """``triton``: ``x / scale`` clamped and rounded to ``float8_e4m3fn`` as torch does."""
    if not _one_element(scale):
        return ir.ops.static_scaled_fp8_quant.native(x, scale)
    if _plain_eager(x):
        return launch.static_scaled_fp8_quant(x, scale)
    return _static_quant_op(x, scale)


def dynamic_per_token_fp8_quant(x: Tensor, scale_ub: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``triton``: one scale per row (its amax over 448, bounded), then quantization."""
    if not _one_element(scale_ub) or not _nonempty_rows(x):
        return ir.ops.dynamic_per_token_fp8_quant.native(x, scale_ub)
    if _plain_eager(x):
        return launch.dynamic_per_token_fp8_quant(x, scale_ub)
    q, scales = _dynamic_quant_op(x, scale_ub)
    return q, scales


def rms_norm_static_fp8_quant(
    x: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> Tensor:
    """``triton``: the ``rms_norm`` kernel, its result quantized before it is stored."""
    if not _weight_fits(x, weight) or not _one_element(scale):
        return ir.ops.rms_norm_static_fp8_quant.native(x, weight, epsilon, scale)
    if _plain_eager(x):
        return launch.rms_norm(x, weight, epsilon, scale=scale)
    return _rms_norm_quant_op(x, weight, epsilon, scale)


def fused_add_rms_norm_static_fp8_quant(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
) -> tuple[Tensor, Tensor]:
    """``triton``, in place: the rounded sum into ``x_residual`` (returned), its
    normalization quantized into a new ``float8_e4m3fn`` tensor; ``x`` is only read."""
    if not _weight_fits(x, weight) or not _same_shape(x, x_residual) or not _one_element(scale):
        return ir.ops.fused_add_rms_norm_static_fp8_quant.native(
            x, x_residual, weight, epsilon, scale
        )
    if _plain_eager(x):
        q = launch.fused_add_rms_norm_static_fp8_quant_(x, x_residual, weight, epsilon, scale)
    else:
        q = _fused_add_rms_norm_quant_op(x, x_residual, weight, epsilon, scale)
    return q, x_residual


def supports_args_for(
    device_types: frozenset[str],
) -> tuple[Callable[..., bool], Callable[..., bool]]:
    """``(rms_norm_supports, fused_add_rms_norm_supports)`` for tensors on ``device_types``."""
    return norm_supports_args(device_types, DTYPES)


def quant_supports_args_for(device_types: frozenset[str]) -> dict[str, Callable[..., bool]]:
    """``supports_args`` of ``silu_and_mul`` and the FP8 ops, by op name."""
    rms_norm_supports, fused_add_rms_norm_supports = supports_args_for(device_types)

    def x_ok(x: Tensor) -> bool:
        return rms_norm_supports(x, None, 0.0)

    def scale_ok(x: Tensor, scale: Tensor | None) -> bool:
        return scale is None or (
            scale.dtype == torch.float32
            and scale.device == x.device
            and scale.layout == torch.strided
            and scale.ndim <= 1
        )

    def silu_and_mul_supports(x: Tensor) -> bool:
        return x_ok(x)

    def gelu_and_mul_supports(x: Tensor, approximate: str = "none") -> bool:
        return x_ok(x) and approximate in ("none", "tanh")

    def rotary_supports(
        query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, is_neox: bool = True
    ) -> bool:
        return (
            x_ok(query)
            and all(
                t.dtype == query.dtype and t.device == query.device and t.layout == torch.strided
                for t in (key, cos, sin)
            )
            and min(query.ndim, key.ndim) >= 2
            and 1 <= cos.ndim == sin.ndim < min(query.ndim, key.ndim)
        )

    def static_supports(x: Tensor, scale: Tensor) -> bool:
        return x_ok(x) and scale_ok(x, scale)

    def dynamic_supports(x: Tensor, scale_ub: Tensor | None = None) -> bool:
        return x_ok(x) and scale_ok(x, scale_ub)

    def rms_norm_quant_supports(
        x: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
    ) -> bool:
        return rms_norm_supports(x, weight, epsilon) and scale_ok(x, scale)

    def fused_quant_supports(
        x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor
    ) -> bool:
        return fused_add_rms_norm_supports(x, x_residual, weight, epsilon) and scale_ok(x, scale)

    return {
        "silu_and_mul": silu_and_mul_supports,
        "gelu_and_mul": gelu_and_mul_supports,
        "rotary_embedding": rotary_supports,
        "static_scaled_fp8_quant": static_supports,
        "dynamic_per_token_fp8_quant": dynamic_supports,
        "rms_norm_static_fp8_quant": rms_norm_quant_supports,
        "fused_add_rms_norm_static_fp8_quant": fused_quant_supports,
    }


_QUANT_IMPLS: dict[str, tuple[Callable[..., object], bool, bool]] = {
    # op: (impl, inplace, batch_invariant). Elementwise, or reducing with an exact
    # maximum, the first three give each row the same bits whatever the batch; the
    # norms reduce in an order the launch configuration may change.
    "silu_and_mul": (silu_and_mul, False, True),
    "gelu_and_mul": (gelu_and_mul, False, True),
    "rotary_embedding": (rotary_embedding, True, True),
    "static_scaled_fp8_quant": (static_scaled_fp8_quant, False, True),
    "dynamic_per_token_fp8_quant": (dynamic_per_token_fp8_quant, False, True),
    "rms_norm_static_fp8_quant": (rms_norm_static_fp8_quant, False, False),
    "fused_add_rms_norm_static_fp8_quant": (fused_add_rms_norm_static_fp8_quant, True, False),
}
"""The ``triton`` impls of the ops only that provider implements."""


def register_impls() -> None:
    """Register both providers' impls (the ops beyond the norms for ``triton`` only);
    vllm-ir calls this through the ProviderSpec."""
    reason = support.unsupported_reason()
    if reason is not None:
        logger.debug("%s impls registered as unsupported: %s", PROVIDER, reason)
    supported = reason is None
    norm_supports = supports_args_for(support.device_types())
    variants = (
        (PROVIDER, rms_norm, fused_add_rms_norm, vllm_fused_add_rms_norm, False),
        (
            BATCH_INVARIANT_PROVIDER,
            rms_norm_batch_invariant,
            fused_add_rms_norm_batch_invariant,
            vllm_fused_add_rms_norm_batch_invariant,
            True,
        ),
    )
    for provider, rms_fn, fused_fn, vllm_fused_fn, invariant in variants:
        register_norm_impls(
            provider,
            rms_fn,
            fused_fn,
            supported=supported,
            supports_args=norm_supports,
            vllm_fused_add_rms_norm=vllm_fused_fn,
            batch_invariant=invariant,
        )
    quant_supports = quant_supports_args_for(support.device_types())
    for name, (fn, inplace, invariant) in _QUANT_IMPLS.items():
        ir.get_op(name).register_impl(
            PROVIDER,
            supported=supported,
            supports_args=quant_supports[name],
            inplace=inplace,
            batch_invariant=invariant,
        )(fn)
