"""How the XPU defaults compose with the other providers' contributions.

vllm-ir-cuda (``vllm_c``, rank 100) and vllm-ir-triton (``triton``, rank -10)
are taken from their installed packages when present, else from stand-in
contributions with the same platforms and ranks, so the composition is
checked in every test environment.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence

import pytest
import vllm_ir as ir
import vllm_ir_xpu
from vllm_ir.priority import (
    add_platform_defaults,
    platform_default_contributions,
    remove_platform_defaults,
)

OPS = ("rms_norm", "fused_add_rms_norm")


def _defaults_of(
    module: str, stand_in: Sequence[ir.PlatformDefaults]
) -> Sequence[ir.PlatformDefaults]:
    try:
        return importlib.import_module(module).provider.defaults  # type: ignore[no-any-return]
    except ImportError:
        return stand_in


CUDA = _defaults_of(
    "vllm_ir_cuda",
    [
        ir.PlatformDefaults(
            "cuda",
            eager={op: ["vllm_c"] for op in OPS},
            compiled={op: ["native"] for op in OPS},
            rank=100,
        )
    ],
)
TRITON = _defaults_of(
    "vllm_ir_triton",
    [
        ir.PlatformDefaults(
            platform,
            eager={op: ["triton", "triton_batch_invariant"] for op in OPS},
            compiled={op: ["native"] for op in OPS},
            rank=-10,
        )
        for platform in ("cuda", "rocm", "xpu")
    ],
)
SOURCES = ("zz-test vllm-ir-cuda", "zz-test vllm-ir-triton")


@pytest.fixture(autouse=True)
def _xpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("VLLM_IR_PLATFORM", "xpu")
    ir.loaded_providers()  # discovery first: it would not overwrite our contributions
    yield
    for source in SOURCES:
        remove_platform_defaults(source)


def _eager(op: str) -> list[str]:
    return ir.get_op(op).get_priority("eager")


@pytest.mark.parametrize("op", OPS)
def test_xpu_eager_list_is_the_design_table(op: str) -> None:
    eager = _eager(op)
    assert eager[0] == "xpu_kernels"
    assert eager[-1] == "native"
    others = [
        source
        for source, _, _ in platform_default_contributions(op, "eager", "xpu")
        if source != "vllm-ir-xpu"
    ]
    if not others:  # only this package contributes XPU defaults (e.g. its own test session)
        assert eager == ["xpu_kernels", "native"]


@pytest.mark.parametrize("op", OPS)
def test_xpu_compiled_list_starts_with_native(op: str) -> None:
    assert ir.get_op(op).get_priority("compiled")[0] == "native"


@pytest.mark.parametrize("op", OPS)
def test_with_the_cuda_and_triton_packages_installed(op: str) -> None:
    add_platform_defaults(SOURCES[0], CUDA)
    add_platform_defaults(SOURCES[1], TRITON)
    assert _eager(op) == ["xpu_kernels", "triton", "triton_batch_invariant", "native"]
    assert ir.get_op(op).get_priority("compiled")[0] == "native"


def test_user_priority_goes_first() -> None:
    with ir.ops.rms_norm.set_priority(["native"]):
        assert _eager("rms_norm")[:2] == ["native", "xpu_kernels"]


@pytest.mark.parametrize("platform", ["cuda", "rocm", "cpu"])
def test_no_defaults_on_other_platforms(monkeypatch: pytest.MonkeyPatch, platform: str) -> None:
    monkeypatch.setenv("VLLM_IR_PLATFORM", platform)
    assert "xpu_kernels" not in _eager("rms_norm")
    assert all(d.platform == "xpu" for d in vllm_ir_xpu.provider.defaults)


def test_entries_say_where_they_came_from() -> None:
    entries = ir.ops.rms_norm.get_priority_entries("eager")
    assert entries[0].provider == "xpu_kernels"
    assert entries[0].source == "xpu eager default of vllm-ir-xpu"
