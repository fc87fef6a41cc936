"""Hostile providers: malformed specs, BaseException at load, half-registration, hangs.

Whatever a provider does while loading, it ends up either loaded or listed in
``load_errors()`` with everything it registered undone, and every other
provider and op keeps working.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from typing import Any

import pytest
import torch
import vllm_ir as ir
from conftest import unique
from test_providers import _rms_impl
from torch import Tensor
from vllm_ir._discovery import providers
from vllm_ir._schema.samples import SampleInput
from vllm_ir._schema.tolerances import DEFAULT_TOLERANCES

PLATFORM = ir.provider.current_platform()


def _good(name: str) -> ir.provider.ProviderSpec:
    return ir.provider.ProviderSpec(
        name=name,
        api_version=ir.provider.API_VERSION,
        register=lambda: ir.ops.rms_norm.register_impl(name)(_rms_impl),
        defaults=[ir.provider.PlatformDefaults(PLATFORM, eager={"rms_norm": [name]})],
    )


def _call_rms_norm() -> Tensor:
    return ir.ops.rms_norm(torch.ones(2, 8), None, 1e-6)  # type: ignore[no-any-return]


# -- defect 1: malformed specs --------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"defaults": {"cpu": {"rms_norm": ["acme"]}}},
            TypeError,
            "sequence of vllm_ir.provider.Platform",
        ),
        ({"defaults": ["cpu"]}, TypeError, "got str 'cpu'"),
        ({"register": None}, TypeError, "register must be a function"),
        ({"name": 3}, TypeError, "ProviderSpec.name must be a provider name"),
        ({"api_version": "1"}, TypeError, "api_version must be an int"),
    ],
)
def test_malformed_spec_is_refused_on_construction(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    spec: dict[str, Any] = {
        "name": "acme",
        "api_version": ir.provider.API_VERSION,
        "register": print,
    }
    with pytest.raises(error, match=message) as info:
        ir.provider.ProviderSpec(**{**spec, **kwargs})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": "high"}, "rank must be an int, got str 'high'"),
        ({"rank": True}, "rank must be an int"),
        ({"eager": None}, "eager must map op names"),
        ({"compiled": ["rms_norm"]}, "compiled must map op names"),
        ({"eager": {3: ["acme"]}}, "keys must be op names"),
        ({"eager": {"rms_norm": "acme"}}, "must be a list of provider names"),
    ],
)
def test_malformed_platform_defaults_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        ir.provider.PlatformDefaults("cpu", **kwargs)


def test_platform_defaults_read_an_iterator_once() -> None:
    d = ir.provider.PlatformDefaults("cpu", eager={"rms_norm": iter(["acme", "native"])})
    assert d.eager == {"rms_norm": ["acme", "native"]}
    assert d.eager == {"rms_norm": ["acme", "native"]}


def test_spec_altered_after_construction_is_a_load_error(fresh_discovery) -> None:  # type: ignore[no-untyped-def]
    name = unique("altered")
    spec = _good(name)
    object.__setattr__(spec, "defaults", ({"cpu": {"rms_norm": [name]}},))
    fresh_discovery["altered"] = spec
    fresh_discovery["good"] = _good(good := unique("good"))
    try:
        errors = ir.load_errors()
        assert "PlatformDefaults" in errors["altered"].cause
        assert "\n" not in errors["altered"].cause
        assert name not in ir.ops.rms_norm.impls
        assert good in ir.ops.rms_norm.impls
        assert _call_rms_norm().shape == (2, 8)  # selection is not broken for anyone
    finally:
        ir.ops.rms_norm.unregister_impl(good)


def test_defaults_naming_an_unknown_op_are_a_load_error_rolled_back(fresh_discovery) -> None:  # type: ignore[no-untyped-def]
    name = unique("typo")
    fresh_discovery["typo"] = ir.provider.ProviderSpec(
        name=name,
        api_version=ir.provider.API_VERSION,
        register=lambda: ir.ops.rms_norm.register_impl(name)(_rms_impl),
        defaults=[ir.provider.PlatformDefaults(PLATFORM, eager={"rms_nrom": [name]})],
    )
    cause = ir.load_errors()["typo"].cause
    assert "unknown IR op 'rms_nrom'" in cause
    assert "rms_norm" in cause
    assert name not in ir.ops.rms_norm.impls  # its register() ran, and was undone
    assert name not in ir.ops.rms_norm.get_priority()


def test_explain_does_not_break_on_a_bad_provider(fresh_discovery, capsys) -> None:  # type: ignore[no-untyped-def]
    from vllm_ir_cli import main

    spec = _good(unique("bad_rank"))
    object.__setattr__(spec.defaults[0], "rank", "high")  # bypasses construction checks
    fresh_discovery["bad_rank"] = spec
    assert main(["explain", "rms_norm"]) == 0
    out = capsys.readouterr().out
    assert "native" in out
    assert "rank must be an int" in ir.load_errors()["bad_rank"].cause


# -- defect 2: BaseException at load ---------------------------------------------


@pytest.mark.parametrize("exc", [SystemExit("argparse said no"), SystemExit(2), GeneratorExit()])
def test_base_exception_at_load_is_isolated(fresh_discovery, exc: BaseException) -> None:  # type: ignore[no-untyped-def]
    def register() -> None:
        raise exc

    fresh_discovery["a_exit"] = ir.provider.ProviderSpec(
        "a_exit", ir.provider.API_VERSION, register
    )
    fresh_discovery["b_good"] = _good(good := unique("b_good"))
    try:
        assert _call_rms_norm().shape == (2, 8)  # the first call does not raise SystemExit
        assert ir.load_errors()["a_exit"].cause.startswith(type(exc).__name__)
        assert "b_good" in ir.loaded_providers()  # discovery went on after it
        assert good in ir.ops.rms_norm.impls
    finally:
        ir.ops.rms_norm.unregister_impl(good)


def test_keyboard_interrupt_propagates_after_rollback(fresh_discovery) -> None:  # type: ignore[no-untyped-def]
    name = unique("interrupted")

    def register() -> None:
        ir.ops.rms_norm.register_impl(name)(_rms_impl)
        raise KeyboardInterrupt

    fresh_discovery["interrupted"] = ir.provider.ProviderSpec(
        "interrupted", ir.provider.API_VERSION, register
    )
    with pytest.raises(KeyboardInterrupt):
        providers.ensure_loaded()
    assert name not in ir.ops.rms_norm.registered_impls


# -- defect 3: full rollback, handles, unregister_impl ---------------------------


def test_failed_provider_leaves_nothing_behind(fresh_discovery) -> None:  # type: ignore[no-untyped-def]
    name, extra, ns = unique("partial"), unique("partial_op"), unique("partial_ns")
    op = ir.ops.rms_norm
    tolerance_before = op.tolerance(torch.float32)
    samples_before = [s.name for s in op.sample_inputs()]
    defaults_before = dict(DEFAULT_TOLERANCES)

    def register() -> None:
        op.register_impl(name)(_rms_impl)

        def extra_fn(x: Tensor) -> Tensor:
            return x + 1

        ir.register_op(name=extra)(extra_fn)
        op.register_tolerances({torch.float32: ir.Tolerance(atol=1.0, rtol=1.0)})
        DEFAULT_TOLERANCES[torch.float16] = ir.Tolerance(atol=1.0, rtol=1.0)

        @op.register_input_generator
        def gen(dtype: torch.dtype, device: torch.device) -> Any:
            yield SampleInput((torch.ones(1, 1), None, 1e-6), "from_partial")

        ir.IrOpPriorityConfig(rms_norm=[name]).apply()

        @torch.library.custom_op(f"{ns}::kernel", mutates_args=())
        def kernel(x: Tensor) -> Tensor:
            return x.clone()

        raise RuntimeError("simulated failure after side effects")

    fresh_discovery["partial"] = ir.provider.ProviderSpec(
        "partial", ir.provider.API_VERSION, register
    )
    assert "partial" in ir.load_errors()
    assert name not in op.impls
    assert extra not in ir.IrOp.registry
    assert op.tolerance(torch.float32) == tolerance_before
    assert [s.name for s in op.sample_inputs()] == samples_before
    assert [e.source for e in op.get_priority_entries()][-1] == "native fallback"
    assert name not in op.get_priority()
    assert not hasattr(getattr(torch.ops, ns), "kernel")
    assert defaults_before == DEFAULT_TOLERANCES

    # and every name it used can be used again
    @torch.library.custom_op(f"{ns}::kernel", mutates_args=())
    def kernel_again(x: Tensor) -> Tensor:
        return x * 2

    assert getattr(torch.ops, ns).kernel(torch.ones(1)).item() == 2.0

    def extra_again(x: Tensor) -> Tensor:
        return x + 2

    again = ir.register_op(name=extra)(extra_again)
    try:
        assert again(torch.zeros(1)).item() == 2.0
    finally:
        again._unregister()


def test_rollback_keeps_other_process_priorities(fresh_discovery) -> None:  # type: ignore[no-untyped-def]
    ir.IrOpPriorityConfig(silu_and_mul=["native"]).apply()
    try:

        def register() -> None:
            ir.IrOpPriorityConfig(rms_norm=["native"]).apply()
            raise RuntimeError("no")

        fresh_discovery["prio"] = ir.provider.ProviderSpec(
            "prio", ir.provider.API_VERSION, register
        )
        ir.load_errors()
        assert ir.ops.silu_and_mul.get_priority_entries()[0].source == "user (process-wide)"
        assert ir.ops.rms_norm.get_priority_entries()[0].source != "user (process-wide)"
    finally:
        ir.clear_process_priority()


def test_unregister_impl_is_public_and_checked(fresh_discovery) -> None:  # type: ignore[no-untyped-def]
    name = unique("public")
    ir.ops.rms_norm.register_impl(name)(_rms_impl)
    assert name in ir.ops.rms_norm.impls
    ir.ops.rms_norm.unregister_impl(name)
    assert name not in ir.ops.rms_norm.impls
    with pytest.raises(KeyError, match=f"no impl from provider '{name}'"):
        ir.ops.rms_norm.unregister_impl(name)
    with pytest.raises(ValueError, match="cannot be unregistered"):
        ir.ops.rms_norm.unregister_impl("native")


def test_registration_handles_undo_exactly_their_registration(fresh_discovery) -> None:  # type: ignore[no-untyped-def]
    name = unique("handle")
    with ir.provider.recording_registrations("acme-kernels 1.0") as log:
        ir.ops.rms_norm.register_impl(name)(_rms_impl)
    (handle,) = log.handles
    assert ir.ops.rms_norm.impls[name].package == "acme-kernels 1.0"
    assert "active" in repr(handle)
    # a later registration under the same name is not the handle's to remove
    ir.ops.rms_norm.unregister_impl(name)
    ir.ops.rms_norm.register_impl(name)(_rms_impl)
    handle.destroy()
    assert handle.removed
    assert name in ir.ops.rms_norm.impls
    ir.ops.rms_norm.unregister_impl(name)
    handle.remove()  # idempotent


def test_recording_scope_rolls_back_on_exception(fresh_discovery) -> None:  # type: ignore[no-untyped-def]
    name = unique("scoped")
    before = dict(ir.ops.rms_norm.tolerances)

    def fail_after_registering() -> None:
        with ir.provider.recording_registrations():
            ir.ops.rms_norm.register_impl(name)(_rms_impl)
            # the deprecated spelling goes through a recorded registration too
            with pytest.warns(DeprecationWarning, match="register_tolerances"):
                ir.ops.rms_norm.tolerances[torch.float16] = ir.Tolerance(atol=1.0, rtol=1.0)
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        fail_after_registering()
    assert name not in ir.ops.rms_norm.impls
    assert dict(ir.ops.rms_norm.tolerances) == before


# -- defect 4: hanging providers -------------------------------------------------


def test_slow_provider_is_logged_before_and_warned_about(
    fresh_discovery, monkeypatch, caplog
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("VLLM_IR_PROVIDER_LOAD_WARN_S", "0.2")
    fresh_discovery["slow"] = ir.provider.ProviderSpec(
        "slow", ir.provider.API_VERSION, lambda: time.sleep(0.6)
    )
    with caplog.at_level(logging.DEBUG, logger="vllm_ir"):
        ir.loaded_providers()
    text = caplog.text
    assert "loading provider 'slow' from package fake_provider_slow" in text
    assert "provider 'slow' (fake_provider_slow) is still loading after 0 s" in text
    assert "took 0." in text


def test_waiting_thread_names_the_slow_provider(fresh_discovery, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    import threading

    monkeypatch.setenv("VLLM_IR_PROVIDER_LOAD_WARN_S", "0.2")
    started = threading.Event()

    def register() -> None:
        started.set()
        time.sleep(0.8)

    fresh_discovery["slow"] = ir.provider.ProviderSpec("slow", ir.provider.API_VERSION, register)
    loader = threading.Thread(target=providers.ensure_loaded)
    with caplog.at_level(logging.WARNING, logger="vllm_ir"):
        loader.start()
        started.wait(5)
        providers.ensure_loaded()
        loader.join()
    assert "waiting for provider 'slow' (fake_provider_slow), loading in another thread" in (
        caplog.text
    )


def test_load_warning_threshold_is_validated(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from vllm_ir import envs

    monkeypatch.setenv("VLLM_IR_PROVIDER_LOAD_WARN_S", "soon")
    with pytest.raises(ValueError, match="VLLM_IR_PROVIDER_LOAD_WARN_S='soon'"):
        envs.provider_load_warn_s()


# -- the r05 scenario end to end, with fake installed distributions --------------


R05_PROVIDERS = {
    "a_hang": "import time\ndef register():\n    time.sleep(1.0)\n",
    "b_partial": (
        "import torch\nfrom torch import Tensor\n"
        "@torch.library.custom_op('r05t_b_partial::kernel', mutates_args=())\n"
        "def kernel(x: Tensor) -> Tensor:\n    return x.clone()\n"
        "def register():\n"
        "    ir.ops.rms_norm.tolerances[torch.float32] = ir.Tolerance(atol=1.0, rtol=1.0)\n"
        "    ir.IrOpPriorityConfig(rms_norm=['native']).apply()\n"
        "    raise RuntimeError('b_partial: simulated failure after side effects')\n"
    ),
    "c_exit": "def register():\n    raise SystemExit('c_exit: argparse rejected sys.argv')\n",
    "d_good": (
        "from torch import Tensor\n"
        "def register():\n"
        "    @ir.ops.rms_norm.register_impl('d_good')\n"
        "    def _impl(x: Tensor, weight: Tensor | None, epsilon: float,"
        " variance_size: int | None = None) -> Tensor:\n"
        "        return ir.ops.rms_norm.native(x, weight, epsilon, variance_size)\n"
    ),
}

R05_CHECK = """
import threading, time, torch, vllm_ir as ir
t = threading.Thread(target=lambda: ir.ops.rms_norm(torch.ones(2, 8), None, 1e-6))
t.start(); time.sleep(0.2); ir.ops.rms_norm.get_priority(); t.join()
assert sorted(ir.loaded_providers()) == ['a_hang', 'd_good'], ir.loaded_providers()
assert sorted(ir.load_errors()) == ['b_partial', 'c_exit'], ir.load_errors()
assert ir.load_errors()['c_exit'].cause.startswith('SystemExit: c_exit')
assert 'd_good' in ir.ops.rms_norm.impls
assert ir.ops.rms_norm.tolerance(torch.float32) == ir.Tolerance(atol=1e-5, rtol=1e-5)
assert ir.ops.rms_norm.get_priority_entries()[0].source != 'user (process-wide)'
assert not hasattr(torch.ops.r05t_b_partial, 'kernel')
print('ok')
"""


def test_hostile_installed_providers_end_to_end(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for name, body in R05_PROVIDERS.items():
        module = f"r05t_{name}"
        (tmp_path / f"{module}.py").write_text(
            f"import vllm_ir as ir\n{body}"
            f"provider = ir.provider.ProviderSpec(name={name!r},"
            " api_version=ir.provider.API_VERSION, register=register)\n"
        )
        info = tmp_path / f"{module}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[vllm_ir.providers]\n{name} = {module}:provider\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("VLLM_")},
        "PYTHONPATH": str(tmp_path),
        "VLLM_IR_PROVIDERS": ",".join(R05_PROVIDERS),
        "VLLM_IR_PROVIDER_LOAD_WARN_S": "0.3",
    }
    proc = subprocess.run(
        [sys.executable, "-c", R05_CHECK], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert "provider 'a_hang' (r05t_a_hang 0.1) is still loading" in proc.stderr
    assert "waiting for provider 'a_hang'" in proc.stderr
