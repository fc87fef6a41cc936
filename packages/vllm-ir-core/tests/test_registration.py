"""register_op / register_impl: what they define, and what they refuse."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable

import pytest
import torch
import vllm_ir as ir
from conftest import scale, unique
from torch import Tensor


def test_register_op_defines_torch_op_fake_and_namespace(make_op: Callable[..., ir.IrOp]) -> None:
    op = make_op(scale)
    packet = getattr(torch.ops.vllm_ir, op.name)
    assert op.torch_op is packet.default
    assert getattr(ir.ops, op.name) is op
    assert ir.get_op(op.name) is op
    assert list(op.impls) == ["native"]
    with torch._subclasses.FakeTensorMode():
        out = op.torch_op(torch.empty(3, 5), 2.0)
    assert out.shape == (3, 5)
    assert not hasattr(packet, "maybe_inplace")


def test_register_op_bare_and_with_arguments() -> None:
    def bare_op_fn(x: Tensor) -> Tensor:
        return x + 1

    bare_op_fn.__name__ = unique("bare")
    op = ir.register_op(bare_op_fn)
    named = ir.register_op(name=unique("named"), activations=["y"], allow_inplace=True)(
        lambda_free_op
    )
    try:
        assert op.name == bare_op_fn.__name__
        assert named.activations == ("y",)
        assert named.maybe_inplace.torch_op is getattr(torch.ops.vllm_ir, named.name).maybe_inplace
    finally:
        op._unregister()
        named._unregister()


def lambda_free_op(y: Tensor, z: Tensor) -> Tensor:
    return y * z


def test_activations_default_to_parameters_starting_with_x(make_op) -> None:
    def op_fn(x: Tensor, x_residual: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
        return x, x_residual

    assert make_op(op_fn, allow_inplace=True).activations == ("x", "x_residual")
    assert ir.ops.fused_add_rms_norm.activations == ("x", "x_residual")
    assert ir.ops.rms_norm.activations == ("x",)


@pytest.mark.parametrize(
    ("kwargs", "fn_src", "error", "match"),
    [
        ({"name": "has space"}, "scale", ValueError, "must be an ASCII Python identifier"),
        ({"name": "_private"}, "scale", ValueError, "must not start with an underscore"),
        ({"name": "rms_norm"}, "scale", ValueError, "already registered"),
        ({"name": "layernorm"}, "scale", ValueError, "would shadow vllm_ir.ops.layernorm"),
        ({"activations": ["nope"]}, "scale", ValueError, "activation 'nope' is not a parameter"),
        ({"activations": ["factor"]}, "scale", TypeError, "activations must be Tensors"),
        ({"allow_inplace": True, "activations": []}, "scale", ValueError, "no activations"),
        ({"allow_inplace": True}, "two_out", ValueError, "returns 2 tensor"),
        ({}, "unannotated", TypeError, "has no type annotation"),
        ({}, "kwonly", TypeError, "keyword-only"),
    ],
)
def test_register_op_rejects(kwargs, fn_src, error, match) -> None:
    def two_out(x: Tensor) -> tuple[Tensor, Tensor]:
        return x, x

    def unannotated(x: Tensor, factor) -> Tensor:  # type: ignore[no-untyped-def]
        return x

    def kwonly(x: Tensor, *, factor: float) -> Tensor:
        return x

    fns = {"scale": scale, "two_out": two_out, "unannotated": unannotated, "kwonly": kwonly}
    kwargs = {"name": unique("rejected"), **kwargs}
    before = set(ir.IrOp.registry)
    with pytest.raises(error, match=match):
        ir.register_op(**kwargs)(fns[fn_src])
    assert set(ir.IrOp.registry) == before
    assert not hasattr(torch.ops.vllm_ir, kwargs["name"]) or kwargs["name"] in before


def test_failed_torch_definition_registers_nothing() -> None:
    def bad_schema(x: Tensor, blob: object) -> Tensor:  # object has no torch schema type
        return x

    name = unique("bad_schema")
    with pytest.raises(TypeError, match="has no torch schema"):
        ir.register_op(name=name)(bad_schema)
    assert name not in ir.IrOp.registry
    # the name is free again: a corrected definition succeeds
    ok = ir.register_op(name=name)(scale)
    ok._unregister()


def test_register_impl_and_attributes(scale_op: ir.IrOp) -> None:
    def supports(x, factor):  # type: ignore[no-untyped-def]
        return factor > 0

    @scale_op.register_impl("fast", supports_args=supports, batch_invariant=True)
    def fast(x: Tensor, factor: float) -> Tensor:
        return torch.mul(x, factor)

    impl = scale_op.impls["fast"]
    assert fast.__name__ == "fast"  # the decorator returns the function
    assert (impl.provider, impl.impl_fn, impl.supported, impl.supports_args) == (
        "fast",
        fast,
        True,
        supports,
    )
    assert (impl.inplace, impl.batch_invariant) == (False, True)
    assert impl.package  # resolved from the registering module
    assert scale_op.impls["native"].batch_invariant


def _impl_for(op: ir.IrOp):  # type: ignore[no-untyped-def]
    def impl(x: Tensor, factor: float) -> Tensor:
        return x * factor

    return impl


@pytest.mark.parametrize(
    ("provider", "kwargs", "error", "match"),
    [
        ("native", {}, ValueError, "reserved"),
        ("not-an-identifier", {}, ValueError, "must be a Python identifier"),
        ("p", {"supported": lambda: True}, TypeError, "supported must be a bool.*call it"),
        ("p", {"inplace": 1}, TypeError, "inplace must be a bool"),
        ("p", {"supports_args": 3}, TypeError, "must be callable"),
        ("p", {"supports_args": lambda x: True}, TypeError, "must take the op's own parameters"),
        ("p", {"supports_args": lambda x, f: True}, TypeError, "same names"),
        ("p", {"supports_args": lambda x, factor=1.0: True}, TypeError, "defaults"),
        ("p", {"inplace": True}, ValueError, "without allow_inplace=True"),
    ],
)
def test_register_impl_rejects(scale_op: ir.IrOp, provider, kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        scale_op.register_impl(provider, **kwargs)(_impl_for(scale_op))
    assert list(scale_op.impls) == ["native"]


def test_register_impl_rejects_duplicate_provider(scale_op: ir.IrOp) -> None:
    scale_op.register_impl("dup")(_impl_for(scale_op))
    with pytest.raises(ValueError, match="already has an impl from provider 'dup'"):
        scale_op.register_impl("dup")(_impl_for(scale_op))


@pytest.mark.parametrize(
    "impl_src",
    [
        "def impl(x: Tensor, scale: float) -> Tensor: return x",  # name
        "def impl(x: Tensor, factor: int) -> Tensor: return x",  # annotation
        "def impl(x: Tensor, factor: float = 2.0) -> Tensor: return x",  # default
        "def impl(x: Tensor) -> Tensor: return x",  # arity
        "def impl(x, factor): return x",  # missing annotations
    ],
)
def test_register_impl_rejects_signature_mismatch(scale_op: ir.IrOp, impl_src: str) -> None:
    namespace: dict[str, object] = {"Tensor": Tensor}
    exec(impl_src, namespace)
    with pytest.raises(TypeError) as info:
        scale_op.register_impl("mismatch")(namespace["impl"])  # type: ignore[arg-type]
    message = str(info.value)
    assert "(x: torch.Tensor, factor: float) -> torch.Tensor" in message  # the native one
    assert "impl(" in message  # and the offending one
    assert "mismatch" not in scale_op.impls


def test_string_annotations_compare_resolved(scale_op: ir.IrOp) -> None:
    namespace: dict[str, object] = {}
    exec(
        "from __future__ import annotations\n"
        "from torch import Tensor\n"
        "def impl(x: Tensor, factor: float) -> Tensor: return x * factor\n",
        namespace,
    )
    scale_op.register_impl("stringly")(namespace["impl"])  # type: ignore[arg-type]
    assert "stringly" in scale_op.impls


def test_maybe_inplace_missing_without_allow_inplace(scale_op: ir.IrOp) -> None:
    with pytest.raises(AttributeError, match="allow_inplace=True"):
        scale_op.maybe_inplace


def test_unknown_op_lists_known_ones() -> None:
    with pytest.raises(KeyError, match=r"known ops:.*rms_norm"):
        ir.get_op("no_such_op")
    with pytest.raises(AttributeError, match="unknown IR op 'no_such_op'"):
        ir.ops.no_such_op


# -- registration errors a new provider author meets --------------------------


def test_impl_with_local_imports_under_future_annotations_registers() -> None:
    import textwrap

    source = textwrap.dedent(
        """
        from __future__ import annotations
        import vllm_ir as ir

        def register(name):
            from torch import Tensor

            @ir.ops.rms_norm.register_impl(name)
            def impl(x: Tensor, weight: Tensor | None, epsilon: float,
                     variance_size: int | None = None) -> Tensor:
                return ir.ops.rms_norm.native(x, weight, epsilon, variance_size)
        """
    )
    namespace: dict[str, object] = {"__name__": "acme_kernels"}
    exec(compile(source, "acme_kernels.py", "exec"), namespace)
    name = unique("local_import")
    namespace["register"](name)  # type: ignore[operator]
    try:
        assert name in ir.ops.rms_norm.impls
    finally:
        ir.ops.rms_norm.unregister_impl(name)


def test_unevaluable_annotation_is_named() -> None:
    def impl(x: Tensr, weight, epsilon, variance_size=None):  # type: ignore[no-untyped-def,name-defined]  # noqa: F821
        return x

    with pytest.raises(TypeError, match=r"annotation 'Tensr' of parameter 'x' .* could not be"):
        ir.ops.rms_norm.register_impl(unique("typo"))(impl)


@pytest.mark.parametrize(
    ("params", "difference"),
    [
        ("x, weight, eps, variance_size=None", "parameter 3 is named 'eps', the op's is 'epsilon'"),
        ("x, weight, epsilon", "it lacks the op's parameter(s) 'variance_size'"),
        ("x, weight, epsilon, variance_size=1", "parameter 'variance_size' has default 1"),
    ],
)
def test_signature_mismatch_names_the_parameter(params: str, difference: str) -> None:
    annotations = {
        "x": "Tensor",
        "weight": "Tensor | None",
        "eps": "float",
        "epsilon": "float",
        "variance_size": "int | None",
    }
    rendered = ", ".join(
        f"{p.split('=')[0]}: {annotations[p.split('=')[0]]}"
        + (f"={p.split('=')[1]}" if "=" in p else "")
        for p in (q.strip() for q in params.split(","))
    )
    namespace: dict[str, object] = {"Tensor": Tensor}
    exec(f"def impl({rendered}) -> Tensor:\n    return x\n", namespace)
    with pytest.raises(TypeError) as info:
        ir.ops.rms_norm.register_impl(unique("mismatch"))(namespace["impl"])  # type: ignore[arg-type]
    message = str(info.value)
    assert difference in message
    assert "\n" not in message


# -- generated code never shares names with the op's parameters -------------


def flagged(x: Tensor, fn: bool) -> Tensor:
    return x * 2 if fn else x.clone()


def named_like_generated(x: Tensor, _miss: float, _calls: float, t: list[Tensor]) -> Tensor:
    return x * _miss + _calls + sum(t)


@pytest.mark.parametrize("provider", ["native", "impl"])
def test_parameters_named_like_generated_code_reach_the_impl(make_op, provider: str) -> None:  # type: ignore[no-untyped-def]
    op = make_op(flagged)
    op.register_impl("impl")(flagged)
    other = make_op(named_like_generated)
    other.register_impl("impl")(named_like_generated)
    x = torch.ones(3)
    with op.set_priority([provider]), other.set_priority([provider]):
        for _ in range(2):  # the miss, then the cached call
            assert op(x, False).tolist() == [1.0, 1.0, 1.0]
            assert op(x, fn=True).tolist() == [2.0, 2.0, 2.0]
            got = other(x, 2.0, 1.0, [torch.ones(3)])
            assert got.tolist() == [4.0, 4.0, 4.0]


@pytest.mark.parametrize("param", ["self", "_vllm_ir_fn"])
def test_reserved_parameter_names_are_refused_and_rolled_back(param: str) -> None:
    name = unique("reserved_param")
    namespace: dict[str, object] = {"Tensor": Tensor}
    exec(f"def f(x: Tensor, {param}: float) -> Tensor:\n    return x * {param}\n", namespace)
    with pytest.raises(ValueError, match=f"parameter name '{param}' is reserved"):
        ir.register_op(name=name)(namespace["f"])
    assert f"vllm_ir::{name}" not in torch.library._defs
    op = ir.register_op(name=name)(scale)  # the name is free again
    try:
        assert op(torch.ones(2), 3.0).tolist() == [3.0, 3.0]
    finally:
        op._unregister()


def test_a_failure_after_the_torch_definition_rolls_it_back(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from vllm_ir._op import op as op_module

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("code generation failed")

    monkeypatch.setattr(op_module, "EagerCall", broken)
    name = unique("half_declared")
    with pytest.raises(RuntimeError, match="code generation failed"):
        ir.register_op(name=name)(scale)
    assert f"vllm_ir::{name}" not in torch.library._defs
    assert name not in ir.IrOp.registry
    monkeypatch.undo()
    ir.register_op(name=name)(scale)._unregister()


class _CallableObject:
    def __call__(self, x: Tensor) -> Tensor:
        return x + 0


def _plus(x: Tensor) -> Tensor:
    return x + 0


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: ir.register_op(name="rëview_op")(_plus), ValueError, "ASCII Python identifier"),
        (lambda: ir.register_op(name="name")(_plus), ValueError, "attribute of torch.ops.vllm_ir"),
        (lambda: ir.register_op(_CallableObject()), TypeError, "has no __name__; pass name="),
        (
            lambda: ir.register_op(name=unique("act"), activations=123)(_plus),  # type: ignore[arg-type]
            TypeError,
            "activations must be a list of parameter names",
        ),
        (
            lambda: ir.register_op(name=unique("flag"), allow_inplace="yes")(_plus),  # type: ignore[call-overload]
            TypeError,
            "allow_inplace must be a bool",
        ),
        (lambda: ir.register_op(name=5)(_plus), TypeError, "name must be a str"),  # type: ignore[call-overload]
    ],
)
def test_register_op_refuses_bad_arguments_in_one_line(make, error, match) -> None:  # type: ignore[no-untyped-def]
    before = set(torch.library._defs)
    with pytest.raises(error, match=match) as info:
        make()
    assert "\n" not in str(info.value)
    assert set(torch.library._defs) == before


def test_register_impl_with_a_function_returns_a_handle_for_that_registration(
    scale_op: ir.IrOp,
) -> None:
    def mine(x: Tensor, factor: float) -> Tensor:
        return x * factor

    first = scale_op.register_impl("mine", mine)
    assert scale_op.impls["mine"].impl_fn is mine
    scale_op.unregister_impl("mine")
    second = scale_op.register_impl("mine", mine, batch_invariant=True)
    first.remove()  # its registration is gone already: the later one stays
    assert scale_op.impls["mine"].batch_invariant
    second.remove()
    assert "mine" not in scale_op.impls
    scale_op.register_impl("mine", mine)
    with pytest.raises(ValueError, match="already has an impl from provider 'mine'"):
        scale_op.register_impl("mine", mine)


def _register_held(op: ir.IrOp) -> weakref.ref[Callable[..., object]]:
    """Register an inplace impl; only the op holds it (this frame's locals go)."""

    def held(x: Tensor, x_other: Tensor) -> tuple[Tensor, Tensor]:
        x_other.add_(x)
        torch.mul(x_other, 2, out=x)
        return x, x_other

    op.register_impl("held", held, inplace=True)
    return weakref.ref(held)


def test_an_unregistered_impl_is_forgotten_by_the_wrappers_that_ran_it(
    inplace_op: ir.IrOp,
) -> None:
    """The selector tells its subscribers: nothing keeps the impl's function alive."""
    ref = _register_held(inplace_op)
    with inplace_op.set_priority(["held"]):
        inplace_op(torch.ones(2, 4), torch.ones(2, 4))  # on copies
        inplace_op.maybe_inplace(torch.ones(2, 4), torch.ones(2, 4))  # donating
    assert ref() is not None
    inplace_op.unregister_impl("held")
    gc.collect()
    assert ref() is None


def test_parameters_named_like_builtins_reach_the_impl(make_op: Callable[..., ir.IrOp]) -> None:
    """Generated code shares the parameters' scope: a parameter called ``any``
    (or ``Exception``) must not shadow what it calls (reliability-v4 05)."""
    namespace: dict[str, object] = {}
    exec(
        "def builtin_names(x: Tensor, any: list[Tensor], Exception: float) -> Tensor:\n"
        "    return x * Exception + sum(any)\n",
        {"Tensor": Tensor},
        namespace,
    )
    op = make_op(namespace["builtin_names"], allow_inplace=True)
    x, ys = torch.ones(2, requires_grad=True), [torch.ones(2, requires_grad=True)]
    op(x, ys, 3.0).sum().backward()
    assert torch.equal(op(torch.ones(2), [torch.ones(2)], 3.0), torch.full((2,), 4.0))
    assert torch.equal(op.maybe_inplace(torch.ones(2), [torch.ones(2)], 3.0), torch.full((2,), 4.0))
    assert x.grad is not None
    assert ys[0].grad is not None


@pytest.mark.parametrize("default", ['a"b', "a\\b", "a\nb"])
def test_a_str_default_a_schema_cannot_hold_is_one_clear_error(
    make_op: Callable[..., ir.IrOp], default: str
) -> None:
    """torch renders str defaults in double quotes, unescaped: a quote breaks its
    parser (a 3-line error), a backslash changes the default (reliability-v4 17)."""
    namespace: dict[str, object] = {}
    exec(
        "def quoted(x: Tensor, s: str = D) -> Tensor:\n    return x * len(s)\n",
        {"Tensor": Tensor, "D": default},
        namespace,
    )
    with pytest.raises(ValueError, match="cannot hold") as caught:
        make_op(namespace["quoted"])
    assert "\n" not in str(caught.value)
    namespace["quoted"].__defaults__ = ("a'b",)  # a single quote is fine
    assert make_op(namespace["quoted"])(torch.ones(1)).item() == 3.0
