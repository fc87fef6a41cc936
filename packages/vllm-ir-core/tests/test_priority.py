"""Effective priority lists: composition, provenance, scopes and threads."""

from __future__ import annotations

import asyncio
import contextvars
import os
import subprocess
import sys
import threading

import pytest
import torch
import vllm_ir as ir
from torch import Tensor
from vllm_ir import priority


def _register(op: ir.IrOp, *providers: str) -> None:
    for provider in providers:

        def impl(x: Tensor, factor: float) -> Tensor:
            return x * factor

        op.register_impl(provider)(impl)


@pytest.fixture
def defaults(scale_op: ir.IrOp):  # type: ignore[no-untyped-def]
    _register(scale_op, "vendor", "triton", "other")
    platform = ir.provider.current_platform()
    priority.add_platform_defaults(
        "pkg-b",
        [ir.provider.PlatformDefaults(platform, eager={scale_op.name: ["triton"]}, rank=10)],
    )
    priority.add_platform_defaults(
        "pkg-a",
        [
            ir.provider.PlatformDefaults(platform, eager={scale_op.name: ["vendor"]}, rank=100),
            ir.provider.PlatformDefaults(
                "xpu" if platform != "xpu" else "cuda", eager={scale_op.name: ["other"]}
            ),
        ],
    )
    yield scale_op
    priority.remove_platform_defaults("pkg-a")
    priority.remove_platform_defaults("pkg-b")


def test_defaults_merge_by_rank_then_user_first(defaults: ir.IrOp) -> None:
    op = defaults
    assert op.get_priority() == ["vendor", "triton", "native"]
    with op.set_priority(["triton"]):
        entries = op.get_priority_entries()
    assert [(e.provider, e.source) for e in entries] == [
        ("triton", "user (scoped)"),
        ("vendor", f"{ir.provider.current_platform()} eager default of pkg-a"),
        ("native", "native fallback"),
    ]
    # other platforms' defaults do not apply
    assert "other" not in op.get_priority()


def test_equal_rank_merges_by_package_name(scale_op: ir.IrOp) -> None:
    _register(scale_op, "p1", "p2")
    platform = ir.provider.current_platform()
    priority.add_platform_defaults(
        "zzz", [ir.provider.PlatformDefaults(platform, eager={scale_op.name: ["p1"]})]
    )
    priority.add_platform_defaults(
        "aaa", [ir.provider.PlatformDefaults(platform, eager={scale_op.name: ["p2"]})]
    )
    try:
        assert scale_op.get_priority() == ["p2", "p1", "native"]
    finally:
        priority.remove_platform_defaults("zzz")
        priority.remove_platform_defaults("aaa")


def test_native_named_early_stays_where_named(defaults: ir.IrOp) -> None:
    with defaults.set_priority(["native", "triton"]):
        assert defaults.get_priority() == ["native", "triton", "vendor"]


def test_scopes_nest_and_restore_on_exception(defaults: ir.IrOp) -> None:
    op = defaults
    with op.set_priority(["triton"]):
        with op.set_priority(["other"]):
            assert op.get_priority()[0] == "other"
        assert op.get_priority()[0] == "triton"
        with pytest.raises(RuntimeError), op.set_priority(["native"]):
            raise RuntimeError("boom")
        assert op.get_priority()[0] == "triton"
    assert op.get_priority()[0] == "vendor"


def test_scope_of_one_op_keeps_the_others(defaults: ir.IrOp) -> None:
    with ir.ops.rms_norm.set_priority(["native"]), defaults.set_priority(["other"]):
        assert ir.ops.rms_norm.get_priority() == ["native"]
        assert defaults.get_priority()[0] == "other"


def test_process_wide_applies_to_other_threads(defaults: ir.IrOp) -> None:
    ir.IrOpPriorityConfig(**{defaults.name: ["other"]}).apply()
    seen = []
    thread = threading.Thread(target=lambda: seen.append(defaults.get_priority()[0]))
    thread.start()
    thread.join()
    assert seen == ["other"]
    assert defaults.get_priority_entries()[0].source == "user (process-wide)"


def test_scopes_are_isolated_between_threads(defaults: ir.IrOp) -> None:
    op = defaults
    x = torch.ones(1)
    barrier = threading.Barrier(2)
    results: dict[str, list[str]] = {}

    def worker(provider: str) -> None:
        with op.set_priority([provider]):
            barrier.wait()  # both scopes are open at once
            picked = [op.selected_impl(x, 1.0).provider for _ in range(50)]
            barrier.wait()
        results[provider] = picked

    threads = [threading.Thread(target=worker, args=(p,)) for p in ("triton", "other")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(results["triton"]) == {"triton"}
    assert set(results["other"]) == {"other"}
    assert op.selected_impl(x, 1.0).provider == "vendor"


def test_scopes_are_isolated_between_tasks(defaults: ir.IrOp) -> None:
    op = defaults

    async def task(provider: str) -> str:
        with op.set_priority([provider]):
            await asyncio.sleep(0)
            return op.selected_impl(torch.ones(1), 1.0).provider

    async def main() -> list[str]:
        return list(await asyncio.gather(task("triton"), task("other")))

    assert asyncio.run(main()) == ["triton", "other"]


def test_set_priority_validates(defaults: ir.IrOp) -> None:
    known = r"unknown provider\(s\) 'nope'.*known providers: native, other"
    with pytest.raises(ValueError, match=known), defaults.set_priority(["nope"]):
        pass
    bad: list[str] = "triton"  # type: ignore[assignment]
    with pytest.raises(TypeError, match="list of provider names"), defaults.set_priority(bad):
        pass


def test_platform_override(monkeypatch: pytest.MonkeyPatch, scale_op: ir.IrOp) -> None:
    _register(scale_op, "cuda_kernel")
    priority.add_platform_defaults(
        "cuda-pkg", [ir.provider.PlatformDefaults("cuda", eager={scale_op.name: ["cuda_kernel"]})]
    )
    try:
        monkeypatch.setenv("VLLM_IR_PLATFORM", "cuda")
        assert scale_op.get_priority() == ["cuda_kernel", "native"]
        monkeypatch.setenv("VLLM_IR_PLATFORM", "tpu")
        with pytest.raises(
            ValueError,
            match="VLLM_IR_PLATFORM='tpu' is not accepted; accepted values: cuda, rocm, xpu, cpu",
        ):
            scale_op.get_priority()
    finally:
        priority.remove_platform_defaults("cuda-pkg")


def test_platform_defaults_validation() -> None:
    with pytest.raises(ValueError, match="platform must be one of"):
        ir.provider.PlatformDefaults("tpu")
    with pytest.raises(TypeError, match="list of provider names"):
        ir.provider.PlatformDefaults("cpu", eager={"rms_norm": "native"})  # type: ignore[dict-item]


def test_process_wide_change_reaches_ops_a_scope_does_not_name(defaults: ir.IrOp) -> None:
    with ir.ops.rms_norm.set_priority(["native"]):
        ir.IrOpPriorityConfig(**{defaults.name: ["other"]}).apply()
        entry = defaults.get_priority_entries()[0]
        assert (entry.provider, entry.source) == ("other", "user (process-wide)")
        assert defaults.selected_impl(torch.ones(1), 1.0).provider == "other"
    ir.clear_process_priority()
    assert defaults.get_priority()[0] == "vendor"


def test_apply_replace_drops_other_ops(defaults: ir.IrOp) -> None:
    ir.IrOpPriorityConfig(rms_norm=["native"]).apply()
    ir.IrOpPriorityConfig(**{defaults.name: ["other"]}).apply(replace=True)
    assert ir.ops.rms_norm.get_priority_entries()[0].source == "native fallback"
    assert defaults.get_priority()[0] == "other"


# -- scopes held across a generator's yield ---------------------------------

_GENERATOR_SCOPES = """
import contextvars, threading
import torch, vllm_ir as ir
from torch import Tensor

@ir.register_op
def gen_op(x: Tensor) -> Tensor:
    return x + 0

@gen_op.register_impl("alt")
def alt(x: Tensor) -> Tensor:
    return x + 0

op = ir.ops.gen_op
x = torch.ones(2)

def stream(providers):
    with op.set_priority(providers):
        for _ in range(3):
            yield op.get_priority()[0], op.selected_impl(x).provider

def interleaved():
    base = op.get_priority()
    a = stream(["alt"]); assert next(a) == ("alt", "alt")
    b = stream(["native"]); assert next(b) == ("native", "native")
    a.close(); b.close()  # opened a, b; closed a, b
    assert op.get_priority() == base, op.get_priority()
    assert op.selected_impl(x).provider == "native"

def nested_inside():
    base = op.get_priority()
    g = stream(["alt"]); next(g)
    with op.set_priority(["native"]):  # the caller opens a scope on top of it
        contextvars.Context().run(g.close)
        assert op.get_priority() == base
    assert op.get_priority() == base, op.get_priority()

def closed_elsewhere(close):
    base = op.get_priority()
    g = stream(["alt"]); next(g)
    close(g)
    assert op.get_priority() == base, op.get_priority()
    assert op.selected_impl(x).provider == "native"
    assert op(x).tolist() == [1.0, 1.0]

def in_thread(g):
    t = threading.Thread(target=g.close); t.start(); t.join()

for case in (
    interleaved,
    nested_inside,
    lambda: closed_elsewhere(lambda g: contextvars.Context().run(g.close)),
    lambda: closed_elsewhere(lambda g: contextvars.copy_context().run(g.close)),
    lambda: closed_elsewhere(in_thread),
):
    contextvars.Context().run(case)
print("SCOPES OK")
"""


@pytest.mark.slow
def test_generator_scopes_never_leak_into_the_caller() -> None:
    # in a subprocess with a timeout, as a broken scope could hang or poison the suite
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM")}
    env["VLLM_IR_PROVIDERS"] = "none"
    result = subprocess.run(
        [sys.executable, "-c", _GENERATOR_SCOPES],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "SCOPES OK" in result.stdout, result.stderr[-3000:]


def test_a_scope_closed_in_order_keeps_contexts_that_copied_it(scale_op: ir.IrOp) -> None:
    # a task started inside a scope keeps it after the scope exits, as context variables do
    _register(scale_op, "alt")
    with scale_op.set_priority(["alt"]):
        copied = contextvars.copy_context()
    assert scale_op.get_priority()[0] == "native"
    assert copied.run(scale_op.get_priority)[0] == "alt"


def test_an_unknown_provider_of_the_project_names_its_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A provider of one of the project's packages that is not installed says which
    package brings it; installed without an impl of the op, says that; others, nothing."""
    from importlib import metadata

    from vllm_ir._base.provider_packages import PROVIDER_PACKAGES

    op = ir.ops.gelu_and_mul
    name = next(p for p in sorted(PROVIDER_PACKAGES) if p not in op.impls)
    package = PROVIDER_PACKAGES[name]
    installed = {"yes": True}

    def version(dist: str) -> str:
        if dist == package and not installed["yes"]:
            raise metadata.PackageNotFoundError(dist)
        return "0.1.0"

    monkeypatch.setattr(metadata, "version", version)
    installed["yes"] = False
    with pytest.raises(ValueError, match="not installed here") as info:
        op.check_providers([name, "zz"])
    assert str(info.value).startswith(
        f"unknown provider(s) {name!r}, 'zz' for op 'gelu_and_mul' ({name} comes with "
        f"{package}, not installed here: pip install {package}); known providers: "
    )
    installed["yes"] = True
    with pytest.raises(ValueError, match=f"{package}, installed, without an impl of this op"):
        op.check_providers([name])
    with pytest.raises(
        ValueError, match=r"^unknown provider\(s\) 'zz' for op 'gelu_and_mul'; known"
    ):
        op.check_providers(["zz"])
