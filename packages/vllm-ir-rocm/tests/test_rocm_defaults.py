"""How the ROCm defaults compose with the other providers' contributions.

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
import vllm_ir_rocm
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
SOURCES = ("zz-test vllm-ir-cuda", "zz-test vllm-ir-triton", "zz-test vllm-ir-cuda-rocm")


@pytest.fixture(autouse=True)
def _rocm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("VLLM_IR_PLATFORM", "rocm")
    ir.loaded_providers()  # discovery first: it would not overwrite our contributions
    yield
    for source in SOURCES:
        remove_platform_defaults(source)


def _eager(op: str) -> list[str]:
    return ir.get_op(op).get_priority("eager")


@pytest.mark.parametrize("op", OPS)
def test_rocm_eager_list_is_the_design_table(op: str) -> None:
    eager = _eager(op)
    assert eager[:2] == ["aiter", "vllm_c"]
    assert eager[-1] == "native"
    others = [
        source
        for source, _, _ in platform_default_contributions(op, "eager", "rocm")
        if source != "vllm-ir-rocm"
    ]
    if not others:  # only this package contributes ROCm defaults (e.g. its own test session)
        assert eager == ["aiter", "vllm_c", "native"]


@pytest.mark.parametrize("op", OPS)
def test_rocm_compiled_list_starts_with_native(op: str) -> None:
    assert ir.get_op(op).get_priority("compiled")[0] == "native"


@pytest.mark.parametrize("op", OPS)
def test_with_the_cuda_and_triton_packages_installed(op: str) -> None:
    add_platform_defaults(SOURCES[0], CUDA)
    add_platform_defaults(SOURCES[1], TRITON)
    assert _eager(op) == ["aiter", "vllm_c", "triton", "triton_batch_invariant", "native"]
    assert ir.get_op(op).get_priority("compiled")[0] == "native"


@pytest.mark.parametrize("op", OPS)
def test_if_vllm_c_also_contributes_rocm_defaults_the_order_holds(op: str) -> None:
    # should vllm-ir-cuda build its kernels for ROCm and list vllm_c there (rank 100)
    add_platform_defaults(
        SOURCES[2],
        [ir.PlatformDefaults("rocm", eager={op: ["vllm_c"] for op in OPS}, rank=100)],
    )
    assert _eager(op)[:2] == ["aiter", "vllm_c"]
    sources = [e.source for e in ir.get_op(op).get_priority_entries("eager")]
    assert sources[:2] == ["rocm eager default of vllm-ir-rocm"] * 2


def test_user_priority_goes_first() -> None:
    with ir.ops.rms_norm.set_priority(["native"]):
        assert _eager("rms_norm")[:3] == ["native", "aiter", "vllm_c"]


@pytest.mark.parametrize("platform", ["cuda", "xpu", "cpu"])
def test_no_defaults_on_other_platforms(monkeypatch: pytest.MonkeyPatch, platform: str) -> None:
    monkeypatch.setenv("VLLM_IR_PLATFORM", platform)
    assert "aiter" not in _eager("rms_norm")
    assert all(d.platform == "rocm" for d in vllm_ir_rocm.provider.defaults)


def test_entries_say_where_they_came_from() -> None:
    entries = ir.ops.rms_norm.get_priority_entries("eager")
    assert entries[0].provider == "aiter"
    assert "rocm eager default" in entries[0].source
    assert "vllm-ir-rocm" in entries[0].source
