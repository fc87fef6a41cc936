"""Out-of-tree platforms: declared in-process or by entry points, detected, overridden."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import pytest
import torch
import vllm_ir as ir
from fake_entry_points import Entry, serving
from vllm_ir import priority
from vllm_ir._base import platform as platform_mod
from vllm_ir._base.runtime import RUNTIME
from vllm_ir._discovery import providers
from vllm_ir.provider import (
    Platform,
    PlatformDefaults,
    ProviderSpec,
    current_platform,
    device_type,
    register_platform,
)


def _nova(detect: bool = True, **kwargs: Any) -> Platform:
    return Platform("nova", device_type="cpu", detect=lambda: detect, **kwargs)


@pytest.fixture
def nova() -> Iterator[Platform]:
    """``nova`` (device: the CPU) declared and detected, with eager defaults for ``scale``."""
    declared = _nova(eager={"rms_norm": ["native"]})
    handle = register_platform(declared, "nova-ir 1.0")
    yield declared
    handle.remove()


def test_a_declared_platform_is_detected_with_its_defaults(nova: Platform) -> None:
    assert current_platform() == "nova"
    assert device_type() == "cpu"
    entries = ir.ops.rms_norm.get_priority_entries("eager")
    assert [(e.provider, e.source) for e in entries] == [
        ("native", "nova eager default of nova-ir (platform nova)")
    ]
    # other packages may now contribute defaults for it
    assert PlatformDefaults("nova", eager={"rms_norm": ["x"]}).platform == "nova"
    assert platform_mod.describe() == "nova (declared by nova-ir 1.0, device cpu)"


def test_unknown_platform_names_are_refused_listing_the_known_ones(nova: Platform) -> None:
    with pytest.raises(ValueError, match=r"one of cuda, rocm, xpu, cpu, nova .*got str 'nvoa'"):
        PlatformDefaults("nvoa")


def test_one_name_claimed_by_two_packages_is_an_error_naming_both(nova: Platform) -> None:
    with pytest.raises(ValueError, match=r"declared by both nova-ir 1\.0 and other-ir 2\.0"):
        register_platform(_nova(), "other-ir 2.0")


def test_removal_undoes_platform_and_defaults() -> None:
    handle = register_platform(_nova(eager={"rms_norm": ["native"]}), "nova-ir 1.0")
    handle.remove()
    assert current_platform() == "cpu"
    assert "nova" not in platform_mod.known_platforms()
    sources = [e.source for e in ir.ops.rms_norm.get_priority_entries("eager")]
    assert not any("nova" in s for s in sources)
    with pytest.raises(ValueError, match="got str 'nova'"):
        PlatformDefaults("nova")


def test_undetected_platform_leaves_builtin_detection() -> None:
    handle = register_platform(_nova(detect=False), "nova-ir 1.0")
    try:
        assert current_platform() == "cpu"
        assert "nova" in platform_mod.known_platforms()
    finally:
        handle.remove()


def test_two_detected_platforms_are_an_error_naming_both() -> None:
    a = register_platform(Platform("nova", "cpu", detect=lambda: True), "nova-ir 1.0")
    b = register_platform(Platform("vega", "cpu", detect=lambda: True), "vega-ir 1.0")
    try:
        with pytest.raises(ValueError, match=r"nova \(nova-ir 1.0\), vega \(vega-ir 1.0\)"):
            current_platform()
    finally:
        a.remove()
        b.remove()


def test_a_detect_that_raises_is_not_this_platform(caplog: pytest.LogCaptureFixture) -> None:
    def probe() -> bool:
        raise OSError("no driver")

    handle = register_platform(Platform("nova", "cpu", detect=probe), "nova-ir 1.0")
    try:
        assert current_platform() == "cpu"
        assert "detect() raised OSError: no driver" in caplog.text
    finally:
        handle.remove()


def test_env_override_accepts_declared_platforms(
    nova: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_IR_PLATFORM", "NOVA")
    assert current_platform() == "nova"
    monkeypatch.setenv("VLLM_IR_PLATFORM", "junk")
    with pytest.raises(ValueError, match=r"VLLM_IR_PLATFORM='junk' .*installed platforms: nova"):
        current_platform()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "Nova", "device_type": "cpu"}, "lower-case identifier"),
        ({"name": "cuda", "device_type": "cuda"}, "cuda is a built-in platform"),
        ({"name": "nova", "device_type": "no-such"}, "device_type must be a torch device type"),
        ({"name": "nova", "device_type": "novadev"}, "torch knows no device type 'novadev'"),
        ({"name": "nova", "device_type": "cpu", "detect": None}, "detect must be a function"),
        ({"name": "nova", "device_type": "cpu", "detect": 3}, "detect must be callable"),
    ],
)
def test_malformed_platforms_are_refused(kwargs: dict[str, Any], message: str) -> None:
    kwargs.setdefault("detect", lambda: True)
    with pytest.raises((TypeError, ValueError), match=message):
        Platform(**kwargs)


@pytest.fixture
def fake_platform_eps(
    fresh_discovery: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[dict[str, object], list[tuple[str, str, object]]]]:
    """``(providers table, platform entries)``: platform entries are ``(name, package, obj)``."""
    entries: list[tuple[str, str, object]] = []

    def listed() -> Iterator[Entry]:
        for i, (name, package, obj) in enumerate(entries):
            yield name, f"{package}_{i}", "platform", obj

    group = platform_mod.ENTRY_POINT_GROUP
    entry_points = serving(monkeypatch, group, listed, metadata.entry_points)
    monkeypatch.setattr(providers.metadata, "entry_points", entry_points)
    yield fresh_discovery, entries
    for name in list(RUNTIME.platforms.registered):
        if name in {n for n, _, _ in entries}:
            entry = RUNTIME.platforms.registered.pop(name)
            priority.remove_platform_defaults(f"{entry.package.split()[0]} (platform {name})")
    platform_mod.redetect()


def test_discovery_loads_platforms_before_providers(
    fake_platform_eps: tuple[dict[str, object], list[tuple[str, str, object]]],
) -> None:
    table, entries = fake_platform_eps
    seen: list[str] = []
    entries.append(("nova", "novapkg", _nova(eager={"rms_norm": ["native"]})))
    # a provider's spec names the installed platform before it is loaded
    table["nova_kernels"] = ProviderSpec(
        name="nova_kernels",
        api_version=ir.provider.API_VERSION,
        register=lambda: seen.append(current_platform()),
        defaults=(PlatformDefaults("nova", eager={"fused_add_rms_norm": ["native"]}),),
    )
    providers.ensure_loaded()
    assert seen == ["nova"], "the provider's register() saw the platform"
    assert "nova" in platform_mod.platforms()
    assert providers.load_errors() == {}


def test_platform_defaults_naming_an_unknown_op_are_a_load_error(
    fake_platform_eps: tuple[dict[str, object], list[tuple[str, str, object]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, entries = fake_platform_eps
    entries.append(("nova", "novapkg", _nova(eager={"rms_nrom": ["native"]})))
    # an op a provider package declares is known once it loaded, whatever the order
    vega = Platform("vega", device_type="cpu", detect=lambda: False, compiled={"rms_norm": []})
    entries.append(("vega", "vegapkg", vega))
    with caplog.at_level(logging.WARNING, logger="vllm_ir"):
        errors = providers.load_errors()
    cause = errors["nova (platform)"].cause
    assert "eager defaults name unknown IR op(s) 'rms_nrom'; known ops: " in cause
    assert "rms_norm" in cause
    assert "vega (platform)" not in errors
    assert "rms_nrom" in caplog.text
    assert "nova" in platform_mod.platforms()  # its other defaults still apply


def test_entry_points_claiming_one_platform_twice_load_neither(
    fake_platform_eps: tuple[dict[str, object], list[tuple[str, str, object]]],
) -> None:
    _, entries = fake_platform_eps
    entries.append(("nova", "alpha", _nova()))
    entries.append(("nova", "beta", _nova()))
    entries.append(("vega", "gamma", _nova()))  # its Platform is named nova: refused
    errors = providers.load_errors()
    cause = errors["nova (platform)"].cause
    assert "platform 'nova' of group vllm_ir.platforms is declared by 2" in cause
    assert "alpha" in cause
    assert "beta" in cause
    assert "declares a platform named 'nova'" in errors["vega (platform)"].cause
    assert platform_mod.platforms() == {}
    assert current_platform() == "cpu"


def test_privateuse1_backend_detection_without_tensors() -> None:
    """A renamed PrivateUse1 backend (no C++ backend in this torch: no tensors can be made)."""
    code = textwrap.dedent(
        """
        import types, torch, vllm_ir as ir
        from vllm_ir.provider import Platform, register_platform, current_platform, device_type
        nova = Platform("nova", device_type="nova", privateuse1=True)  # default detection
        register_platform(nova, "nova-ir 1.0")
        print("before rename", current_platform())
        torch.utils.rename_privateuse1_backend("nova")
        torch.utils.generate_methods_for_privateuse1_backend()
        ir._base.platform.redetect()
        print("renamed, no device module", current_platform())
        torch._register_device_module("nova", types.SimpleNamespace(is_available=lambda: True))
        ir._base.platform.redetect()
        print("available", current_platform(), device_type(), torch.device("nova:0").type)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env["VLLM_IR_PROVIDERS"] = "none"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == [
        "before rename cpu",
        "renamed, no device module cpu",
        "available nova nova nova",
    ]


def test_privateuse1_platform_needs_no_known_device_type_up_front() -> None:
    # before the rename torch knows no "nova" device: privateuse1=True defers the check
    declared = Platform("nova", device_type="nova", privateuse1=True)
    assert not declared.detected()
    assert torch._C._get_privateuse1_backend_name() != "nova"
