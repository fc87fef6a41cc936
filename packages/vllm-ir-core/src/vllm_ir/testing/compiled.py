"""A provider's norm impls through the whole compile pipeline: checks any package can run.

:class:`TinyDecoder` donates its activations with ``maybe_inplace``; compiled
once with the provider selected for ``rms_norm`` and ``fused_add_rms_norm``,
every node must lower to the provider, the lowering's clones of the in-place
kernel's activations must all be eliminated, and the compiled model must
agree with eager (under the same priorities) and with native, for every
batch size without a recompile when compiled dynamic::

    from vllm_ir.testing.compiled import CompiledDecoderChecks

    class TestCompiledDecoder(CompiledDecoderChecks):
        provider = "my_kernels"
        device = "cuda"

A subclass whose provider needs something first (kernels built, stand-ins
installed) overrides the ``provider_ready`` fixture.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch

from vllm_ir import ops
from vllm_ir.config import IrOpPriorityConfig
from vllm_ir.testing.isolation import inductor_caches_off
from vllm_ir.testing.models import TinyDecoder

__all__ = ["CompiledDecoderChecks"]

NORM_OPS = ("rms_norm", "fused_add_rms_norm")


class CompiledDecoderChecks:
    """:class:`TinyDecoder` compiled once per test class with :attr:`provider` selected."""

    provider: ClassVar[str]
    device: ClassVar[str] = "cpu"
    dtype: ClassVar[torch.dtype] = torch.float32
    dynamic: ClassVar[bool] = True
    batches: ClassVar[tuple[int, ...]] = (5, 9)
    hidden: ClassVar[int] = 64
    layers: ClassVar[int] = 3

    @pytest.fixture(scope="class")
    def provider_ready(self) -> None:
        """What the provider needs before the compile (nothing, unless overridden)."""

    @pytest.fixture(scope="class")
    def compiled(self, provider_ready: object) -> tuple[TinyDecoder, Any, Any]:
        """``(model, compiled model, backend)``, compiled once for the class's tests."""
        from vllm_ir.compilation import VllmIRBackend

        torch._dynamo.reset()
        model = TinyDecoder(self.hidden, self.layers, dtype=self.dtype).to(self.device).eval()
        backend = VllmIRBackend(priority={op: [self.provider] for op in NORM_OPS})
        fn = torch.compile(model, backend=backend, dynamic=self.dynamic)
        with inductor_caches_off(), torch.no_grad():
            fn(torch.randn(self.batches[0], self.hidden, dtype=self.dtype, device=self.device))
        assert len(backend.pass_contexts) == 1
        assert not backend.pass_contexts[0].from_cache
        return model, fn, backend

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "batch" in metafunc.fixturenames:
            metafunc.parametrize("batch", self.batches)

    def test_eager_equals_compiled(self, compiled: tuple[Any, Any, Any], batch: int) -> None:
        model, fn, backend = compiled
        x = torch.randn(batch, self.hidden, dtype=self.dtype, device=self.device)
        with torch.no_grad():
            with IrOpPriorityConfig(**{op: [self.provider] for op in NORM_OPS}).scope():
                eager = model(x.clone())
            with IrOpPriorityConfig(**{op: ["native"] for op in NORM_OPS}).scope():
                native = model(x.clone())
            got = fn(x.clone())
        tol = ops.fused_add_rms_norm.tolerance(self.dtype)
        torch.testing.assert_close(got, eager, atol=tol.atol, rtol=tol.rtol)
        torch.testing.assert_close(got, native, atol=tol.atol, rtol=tol.rtol)
        if self.dynamic:
            assert len(backend.pass_contexts) == 1  # no recompile for another batch size

    def test_every_node_lowered_to_the_provider(self, compiled: tuple[Any, Any, Any]) -> None:
        selected = compiled[2].lowering_pass.selected_impls
        assert set(selected) == set(NORM_OPS)
        assert len(selected["fused_add_rms_norm"]) == self.layers
        assert {p for nodes in selected.values() for p in nodes.values()} == {self.provider}

    def test_zero_clones_left(self, compiled: tuple[Any, Any, Any]) -> None:
        ctx = compiled[2].pass_contexts[0]
        assert ctx.functionalized == self.layers
        assert ctx.clones_inserted == 2 * self.layers
        assert ctx.clones_removed == ctx.clones_inserted, ctx.clones_kept
        assert not ctx.clones_kept
