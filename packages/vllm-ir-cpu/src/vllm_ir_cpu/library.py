"""The kernel ops ``torch.ops.vllm_ir_cpu.*``: schemas and fake impls, defined in Python.

Defining the schemas here rather than in C++ lets Dynamo, ``make_fx`` and the
vllm-ir lowering trace calls to the kernels before the library is built (a
FakeTensor call never needs it). The C++ library registers only the CPU
kernels (``TORCH_LIBRARY_IMPL``).

Until the library is loaded, a real call reaches a ``CompositeExplicitAutograd``
kernel that builds and loads it, then calls the op again, which now
dispatches to the C++ kernel (a backend kernel takes precedence over a
composite one). This matters for a compiled graph served from Inductor's
cache in a fresh process: it calls the kernel ops without tracing the impls
that would otherwise have triggered the build.

Ops (``Tensor(a!)``: written in place):

* ``rms_norm(Tensor(a!) out, Tensor x, Tensor? weight, float epsilon) -> ()``
* ``rms_norm_functional(Tensor x, Tensor? weight, float epsilon) -> Tensor``:
  the same into a new contiguous tensor; what the IR impl calls, so graphs
  lowered before Inductor's own passes stay functional.
* ``fused_add_rms_norm(Tensor(a!) x, Tensor(b!) x_residual, Tensor? weight,
  float epsilon) -> ()``: ``x_residual += x`` (rounded to the dtype), then
  ``x = rms_norm(x_residual)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["NAMESPACE", "SCHEMAS", "kernel_ops"]

NAMESPACE = "vllm_ir_cpu"

SCHEMAS: dict[str, str] = {
    "rms_norm": "(Tensor(a!) out, Tensor x, Tensor? weight, float epsilon) -> ()",
    "rms_norm_functional": "(Tensor x, Tensor? weight, float epsilon) -> Tensor",
    "fused_add_rms_norm": (
        "(Tensor(a!) x, Tensor(b!) x_residual, Tensor? weight, float epsilon) -> ()"
    ),
}

_lib = torch.library.Library(NAMESPACE, "DEF")
for _name, _schema in SCHEMAS.items():
    _lib.define(f"{_name}{_schema}")


def _fake_rms_norm(out: Tensor, x: Tensor, weight: Tensor | None, epsilon: float) -> None:
    return None


def _fake_rms_norm_functional(x: Tensor, weight: Tensor | None, epsilon: float) -> Tensor:
    # the kernel allocates its output contiguous, whatever the input's layout
    return x.new_empty(x.shape)


def _fake_fused_add_rms_norm(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float
) -> None:
    return None


torch.library.register_fake(f"{NAMESPACE}::rms_norm", _fake_rms_norm, lib=_lib)
torch.library.register_fake(
    f"{NAMESPACE}::rms_norm_functional", _fake_rms_norm_functional, lib=_lib
)
torch.library.register_fake(f"{NAMESPACE}::fused_add_rms_norm", _fake_fused_add_rms_norm, lib=_lib)


def _build_then_call(name: str) -> Any:
    def kernel(*args: Any) -> Any:
        devices = {a.device.type for a in args if isinstance(a, Tensor)}
        if devices != {"cpu"}:
            raise NotImplementedError(
                f"{NAMESPACE}::{name} runs on CPU tensors only, got tensors on "
                f"{', '.join(sorted(devices))}"
            )
        from vllm_ir_cpu import build

        if build.is_loaded():  # loaded, yet the CPU kernel did not take over
            raise RuntimeError(
                f"{NAMESPACE}::{name}: the library {build.build()} is loaded but registers "
                "no CPU kernel for this op; rebuild it with `python -m vllm_ir_cpu build`"
            )
        build.build()
        return getattr(getattr(torch.ops, NAMESPACE), name).default(*args)

    kernel.__name__ = f"{name}_build_then_call"
    return kernel


for _name in SCHEMAS:
    _lib.impl(_name, _build_then_call(_name), "CompositeExplicitAutograd")


def kernel_ops() -> dict[str, torch._ops.OpOverload]:
    """Name -> ``torch.ops.vllm_ir_cpu.<name>.default`` for every kernel op."""
    packet = getattr(torch.ops, NAMESPACE)
    return {name: getattr(packet, name).default for name in SCHEMAS}
