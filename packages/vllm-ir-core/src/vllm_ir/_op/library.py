"""The torch side of one IR op: its overloads in the ``torch.ops`` namespace.

``torch.ops.<NAMESPACE>.<name>.default`` never mutates its inputs; with
``allow_inplace=True`` a second overload, ``.maybe_inplace``, declares the
activations written. Both run the op's selected impl behind the dispatcher,
have the native function as their fake impl and its gradient as their
autograd formula.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.library import Library, infer_schema

from vllm_ir._base.namespace import NAMESPACE

__all__ = ["define_torch_ops"]

_grad_enabled = torch.is_grad_enabled


def define_torch_ops(op: Any, lib: Library) -> None:
    """Define the overloads of ``op`` (an :class:`~vllm_ir.IrOp` being declared,
    which imports this module) in ``lib``, a ``FRAGMENT`` of the namespace."""
    try:
        schema = infer_schema(op.native, mutates_args=())
    except Exception as e:  # infer_schema explains what it cannot express
        raise TypeError(
            f"cannot declare IR op {op.name!r}: its native signature "
            f"{op.signature} has no torch schema: {e}"
        ) from e
    qualname = f"{NAMESPACE}::{op.name}"

    def kernel_default(*args: Any) -> Any:
        impl = op.selected_impl(*args)
        if impl.inplace:
            args = op._clone_activations(args)
        return impl.impl_fn(*args)

    lib.define(f"{op.name}{schema}")
    lib.impl(op.name, kernel_default, "CompositeExplicitAutograd")
    torch.library.register_fake(qualname, op.native, lib=lib)
    gradient = op._gradient
    torch.library.register_autograd(
        qualname, gradient.backward, setup_context=gradient.setup_context, lib=lib
    )
    if not op.allow_inplace:
        return

    def autograd_maybe_inplace(*args: Any) -> Any:
        # Donating a tensor autograd still needs would corrupt its gradient, so
        # maybe_inplace degrades to the functional overload, which is allowed.
        if _grad_enabled() and op._needs_grad(*args):
            return op.torch_op(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return op.maybe_inplace.torch_op(*args)

    inplace_schema = infer_schema(op.native, mutates_args=op.activations)
    overload = f"{op.name}.maybe_inplace"
    lib.define(f"{overload}{inplace_schema}")
    # A torch schema cannot say "outputs may alias inputs", so behind the
    # dispatcher an inplace impl runs on copies, like the default overload.
    # Memory is reused on the eager fast path and by the compiler's lowering.
    lib.impl(overload, kernel_default, "CompositeExplicitAutograd")
    lib.impl(overload, autograd_maybe_inplace, "Autograd")
    torch.library.register_fake(f"{qualname}.maybe_inplace", op.native, lib=lib)
