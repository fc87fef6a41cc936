"""``torch.compile(..., backend="vllm_ir", mode=...)``: torch hands the named backend
its mode, which becomes Inductor's options for it (reduce-overhead: CUDA graphs)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import vllm_ir as ir
from vllm_ir.compilation import _backend as backend_module


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune-no-cudagraphs"])
def test_named_backend_accepts_torch_compile_modes(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []
    real = backend_module.VllmIRBackend

    def recording(**kwargs: Any) -> Any:
        seen.append(dict(kwargs.get("options") or {}))
        return real(**kwargs)

    monkeypatch.setattr(backend_module, "VllmIRBackend", recording)
    torch._dynamo.reset()
    weight = torch.rand(8) + 0.5

    def f(x: torch.Tensor) -> torch.Tensor:
        return ir.ops.rms_norm(x * 2, weight, 1e-6)

    x = torch.randn(3, 8)
    with ir.ops.rms_norm.set_priority(["native"]):
        got = torch.compile(f, backend="vllm_ir", mode=mode)(x)
        torch.testing.assert_close(got, f(x))
    from torch._inductor import list_mode_options

    assert seen
    assert seen[0] == list_mode_options(mode)
