"""The runtime owns the process's data: the modules with the rules keep none of their own."""

from __future__ import annotations

import torch
import vllm_ir as ir
from vllm_ir import priority
from vllm_ir._base import cache
from vllm_ir._base.runtime import RUNTIME
from vllm_ir._discovery import providers


def test_ops_are_the_runtime_s() -> None:
    assert dict(ir.IrOp.registry) == RUNTIME.ops
    assert RUNTIME.ops["rms_norm"] is ir.ops.rms_norm


def test_the_generation_and_caches_are_the_runtime_s() -> None:
    before = RUNTIME.caches.generation
    ir.invalidate_caches()
    assert RUNTIME.caches.generation == cache.generation() == before + 1
    ir.ops.rms_norm(torch.ones(2, 8), None, 1e-6)
    eager_cache = ir.ops.rms_norm.selector.cache_of("eager")
    assert len(eager_cache) == 1
    # every cache the invalidation clears is on the runtime's list
    assert any(c is ir.ops.rms_norm._calls for c in RUNTIME.caches.caches)
    ir.invalidate_caches()
    assert len(eager_cache) == 0


def test_discovery_state_is_the_runtime_s() -> None:
    assert providers.loaded_providers() == RUNTIME.discovery.loaded
    assert providers.load_errors() == RUNTIME.discovery.errors
    assert RUNTIME.discovery.loaded_once
    assert set(RUNTIME.discovery.registrations) >= set(RUNTIME.discovery.loaded)


def test_priorities_are_the_runtime_s() -> None:
    ir.IrOpPriorityConfig(rms_norm=["native"]).apply()
    assert RUNTIME.priorities.process.priorities["rms_norm"] == ("native",)
    assert priority.process_priorities() is RUNTIME.priorities.process.priorities
    sources = set(RUNTIME.priorities.platform_defaults)
    assert {s for s, *_ in priority.platform_default_contributions("rms_norm", "eager")} <= sources
