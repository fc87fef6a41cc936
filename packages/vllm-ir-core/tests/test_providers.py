"""Provider discovery: loading, API checks, rollback, allow-list, defaults."""

from __future__ import annotations

import sys
import types
from importlib import metadata

import torch
import vllm_ir as ir
from conftest import unique
from torch import Tensor
from vllm_ir._base.runtime import RUNTIME
from vllm_ir._discovery import providers


def _rms_impl(
    x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> Tensor:
    return ir.ops.rms_norm.native(x, weight, epsilon, variance_size)


def _spec(
    provider: str, *, api_version: int = ir.provider.API_VERSION, fail: bool = False
) -> ir.provider.ProviderSpec:
    def register() -> None:
        ir.ops.rms_norm.register_impl(provider)(_rms_impl)
        if fail:
            raise RuntimeError("kernel library missing")

    return ir.provider.ProviderSpec(
        name=provider,
        api_version=api_version,
        register=register,
        defaults=[
            ir.provider.PlatformDefaults(
                ir.provider.current_platform(), eager={"rms_norm": [provider]}
            )
        ],
    )


def test_provider_loads_with_defaults_and_attribution(fresh_discovery) -> None:  # type: ignore[no-untyped-def]
    name = unique("good")
    fresh_discovery[name] = _spec(name)
    try:
        loaded = ir.loaded_providers()
        assert name in loaded
        impl = ir.ops.rms_norm.impls[name]
        assert impl.package == f"fake_provider_{name}"
        assert ir.ops.rms_norm.get_priority() == [name, "native"]
        assert ir.ops.rms_norm.selected_impl(torch.ones(2, 4), None, 1e-6).provider == name
    finally:
        ir.ops.rms_norm.unregister_impl(name)


def test_spec_factory_function_is_accepted(fresh_discovery) -> None:  # type: ignore[no-untyped-def]
    name = unique("factory")
    fresh_discovery[name] = lambda: _spec(name)
    try:
        assert name in ir.loaded_providers()
    finally:
        ir.ops.rms_norm.unregister_impl(name)


def test_failing_provider_is_skipped_and_rolled_back(fresh_discovery, caplog) -> None:  # type: ignore[no-untyped-def]
    good, bad = unique("good"), unique("bad")
    fresh_discovery[bad] = _spec(bad, fail=True)
    fresh_discovery[good] = _spec(good)
    try:
        with caplog.at_level("WARNING", logger="vllm_ir"):
            errors = ir.load_errors()
        assert errors[bad].cause == "RuntimeError: kernel library missing"
        assert "Traceback" in errors[bad].details
        assert bad not in ir.ops.rms_norm.impls  # its partial registration is undone
        assert good in ir.ops.rms_norm.impls
        assert bad not in ir.ops.rms_norm.get_priority()  # nor its defaults
        assert f"provider {bad!r}" in caplog.text
        assert "kernel library missing" in caplog.text
    finally:
        ir.ops.rms_norm.unregister_impl(good)


def test_incompatible_api_version_is_refused(fresh_discovery) -> None:  # type: ignore[no-untyped-def]
    name = unique("future")
    fresh_discovery[name] = _spec(name, api_version=ir.provider.API_VERSION + 1)
    cause = ir.load_errors()[name].cause
    assert f"provider API {ir.provider.API_VERSION + 1}" in cause
    assert f"vllm-ir-core {ir.__version__} provides API {ir.provider.API_VERSION}" in cause
    assert name not in ir.ops.rms_norm.impls


def test_entry_point_of_wrong_type(fresh_discovery) -> None:  # type: ignore[no-untyped-def]
    name = unique("wrong")
    fresh_discovery[name] = {"not": "a spec"}
    assert "must name a vllm_ir.provider.ProviderSpec" in ir.load_errors()[name].cause


def test_allow_list(fresh_discovery, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    kept, skipped = unique("kept"), unique("skipped")
    fresh_discovery[kept] = _spec(kept)
    fresh_discovery[skipped] = _spec(skipped)
    monkeypatch.setenv("VLLM_IR_PROVIDERS", f"{kept},typo_provider")
    try:
        with caplog.at_level("WARNING", logger="vllm_ir"):
            assert set(ir.loaded_providers()) == {kept}
        assert "'typo_provider', but no such provider is installed" in caplog.text
        assert skipped not in ir.ops.rms_norm.impls
    finally:
        ir.ops.rms_norm.unregister_impl(kept)


def test_provider_registering_a_new_op_is_rolled_back(fresh_discovery) -> None:  # type: ignore[no-untyped-def]
    name = unique("newop")
    op_name = unique("provider_op")

    def register() -> None:
        def op_fn(x: Tensor) -> Tensor:
            return x

        ir.register_op(name=op_name)(op_fn)
        raise ImportError("missing dependency")

    fresh_discovery[name] = ir.provider.ProviderSpec(
        name=name, api_version=ir.provider.API_VERSION, register=register
    )
    assert "ImportError: missing dependency" in ir.load_errors()[name].cause
    assert op_name not in ir.IrOp.registry
    assert not hasattr(torch.ops.vllm_ir, op_name)


def test_discovery_runs_once(fresh_discovery) -> None:  # type: ignore[no-untyped-def]
    calls = []
    name = unique("once")
    fresh_discovery[name] = ir.provider.ProviderSpec(
        name, ir.provider.API_VERSION, lambda: calls.append(1)
    )
    ir.loaded_providers()
    ir.ops.rms_norm(torch.ones(1, 4), None, 1e-6)
    ir.loaded_providers()
    assert calls == [1]


def test_import_time_registrations_are_rolled_back(fresh_discovery, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    name = unique("eager_import")
    module = types.ModuleType(f"importing_{name}")

    def module_getattr(attr: str) -> object:
        # what a package does when it registers kernels at import time
        ir.ops.rms_norm.register_impl(name)(_rms_impl)
        return _spec(name, api_version=ir.provider.API_VERSION + 1)

    module.__getattr__ = module_getattr  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(
        providers.metadata,
        "entry_points",
        lambda group: [metadata.EntryPoint(name, f"{module.__name__}:provider", group)],
    )
    assert "provides API" in ir.load_errors()[name].cause
    assert name not in ir.ops.rms_norm.impls


def test_allow_list_none_loads_nothing(fresh_discovery, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    fresh_discovery[unique("skipped")] = _spec("never")
    monkeypatch.setenv("VLLM_IR_PROVIDERS", "none")
    with caplog.at_level("WARNING", logger="vllm_ir"):
        assert ir.loaded_providers() == {}
    assert "no such provider" not in caplog.text


def _claimed_by(name: str, dist_name: str, module: str) -> metadata.EntryPoint:
    ep = metadata.EntryPoint(name, f"{module}:provider", providers.ENTRY_POINT_GROUP)
    return ep._for(types.SimpleNamespace(name=dist_name, version="1.0"))  # type: ignore[attr-defined]


def test_an_entry_point_name_claimed_by_two_distributions_is_a_load_error(
    fresh_discovery, monkeypatch, caplog
) -> None:  # type: ignore[no-untyped-def]
    """Which one importlib lists first depends on install order: neither loads, both named."""
    name = unique("clash")
    calls: list[str] = []
    for which in ("a", "b"):
        module = types.ModuleType(f"clash_{which}_{name}")
        module.provider = ir.provider.ProviderSpec(
            name, ir.provider.API_VERSION, lambda w=which: calls.append(w)
        )  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, module.__name__, module)
    eps = [
        _claimed_by(name, "acme-kernels", f"clash_a_{name}"),
        _claimed_by(name, "other-kernels", f"clash_b_{name}"),
    ]
    for order in (eps, eps[::-1]):
        monkeypatch.setattr(RUNTIME.discovery, "loaded_once", False)
        monkeypatch.setattr(RUNTIME.discovery, "errors", {})
        monkeypatch.setattr(providers.metadata, "entry_points", lambda group, o=order: list(o))
        with caplog.at_level("WARNING", logger="vllm_ir"):
            errors = ir.load_errors()
        assert name not in ir.loaded_providers()
        cause = errors[name].cause
        assert "acme-kernels 1.0" in cause
        assert "other-kernels 1.0" in cause
        assert cause.index("acme-kernels") < cause.index("other-kernels")  # the same either way
        assert "Uninstall all but one" in cause
        assert errors[name].package == "acme-kernels 1.0, other-kernels 1.0"
    assert calls == []
    assert "is skipped" in caplog.text


def test_conformance_cases_load_the_providers_first(fresh_discovery) -> None:  # type: ignore[no-untyped-def]
    """The kit is often a test process's first call: a provider's own ops must be listed."""
    from vllm_ir.testing import conformance_cases

    name = unique("own_ops")
    op_name = unique("provider_own_op")

    def register() -> None:
        def own(x: Tensor) -> Tensor:
            return x * 2

        op = ir.register_op(name=op_name)(own)
        op.register_input_generator(lambda dtype, device: iter([ir.SampleInput(torch.ones(2, 4))]))

        @op.register_impl(name)
        def doubled(x: Tensor) -> Tensor:
            return x + x

    fresh_discovery[name] = ir.provider.ProviderSpec(
        name=name, api_version=ir.provider.API_VERSION, register=register
    )
    registrations = RUNTIME.discovery.registrations
    try:
        cases = conformance_cases(name, checks=["correctness"], dtypes=[torch.float32])
        assert [c.op.name for c in cases] == [op_name]
    finally:
        registrations[name].remove()
    assert op_name not in ir.IrOp.registry
