"""The direct relaunch of compiled kernels (vllm_ir_triton.direct), with a recording stand-in
for a JIT kernel: which calls take Triton's path, which reuse a compiled kernel, and with what."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from vllm_ir_triton import direct, launch


class _Compiled:
    """Stands in for a ``CompiledKernel``: records ``run``."""

    function = "function-handle"
    packed_metadata = "packed"

    def __init__(self, tag: int) -> None:
        self.tag = tag
        self.runs: list[tuple[Any, ...]] = []

    def launch_metadata(self, grid: tuple[int, ...], stream: int, *args: Any) -> Any:
        return ("meta", grid, stream, len(args))

    def run(self, *call: Any) -> None:
        self.runs.append(call)


class _Jit:
    """Stands in for a ``JITFunction``: ``kernel[grid](*args, num_warps=)`` compiles (once per
    call here) and returns the compiled kernel, as Triton does."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, ...], tuple[Any, ...], int]] = []
        self.pre_run_hooks: list[Any] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def launch(*args: Any, num_warps: int) -> _Compiled:
            self.calls.append((grid, args, num_warps))
            return _Compiled(len(self.calls))

        return launch


def _launcher(jit: _Jit, **kwargs: Any) -> direct.Launcher:
    kwargs.setdefault("enabled", True)  # opt-in in production; these tests exercise it
    launcher = direct.Launcher(jit, interpreted=kwargs.pop("interpreted", False), **kwargs)
    launcher._driver = (lambda: 0, lambda device: 1000 + device, lambda: ("enter", "exit"))
    return launcher


def _args(x: torch.Tensor, eps: float = 1e-6) -> tuple[Any, ...]:
    return (x, x.stride(0), x.stride(1), x.shape[1], eps, True, 128)


def test_second_call_of_a_key_relaunches_the_compiled_kernel() -> None:
    jit = _Jit()
    launcher = _launcher(jit)
    x = torch.zeros(4, 64)
    launcher(4, 2, *_args(x))
    assert len(jit.calls) == 1
    compiled = next(iter(launcher.compiled.values()))
    assert compiled.runs == []
    y = torch.ones(9, 64)  # other rows, other data, another epsilon: the same kernel
    launcher(9, 2, *_args(y, eps=1e-5))
    assert len(jit.calls) == 1
    (run,) = compiled.runs
    args = _args(y, eps=1e-5)
    assert run[:10] == (
        9,
        1,
        1,
        1000,
        "function-handle",
        "packed",
        ("meta", (9,), 1000, 7),
        "enter",
        "exit",
        args[0],
    )
    assert run[10:] == args[1:]


@pytest.mark.parametrize(
    "other",
    [
        lambda x: x.to(torch.float16),  # dtype
        lambda x: torch.zeros(5, 65)[:, :64],  # row stride
        lambda x: torch.zeros(64, 4).t(),  # column stride
        lambda x: torch.zeros(4 * 64 + 1)[1:].view(4, 64),  # a 4-byte, not 16-byte, aligned address
        lambda x: torch.zeros(4, 32),  # row length
    ],
    ids=["dtype", "row-stride", "col-stride", "alignment", "hidden"],
)
def test_any_specialized_fact_is_a_new_key(other: Any) -> None:
    jit = _Jit()
    launcher = _launcher(jit)
    x = torch.zeros(4, 64)
    launcher(4, 2, *_args(x))
    y = other(x)
    launcher(4, 2, *_args(y))
    assert len(jit.calls) == 2, "a call differing in a specialized fact must go through Triton"
    assert len(launcher.compiled) == 2


def test_constexprs_and_warps_are_part_of_the_key() -> None:
    jit = _Jit()
    launcher = _launcher(jit)
    x = torch.zeros(4, 64)
    launcher(4, 2, *_args(x))
    launcher(4, 4, *_args(x))
    launcher(4, 2, *_args(x)[:-1], 256)
    assert len(jit.calls) == 3


def test_interpreted_or_disabled_always_takes_tritons_path() -> None:
    for kwargs in ({"interpreted": True}, {"enabled": False}):
        jit = _Jit()
        launcher = _launcher(jit, **kwargs)
        x = torch.zeros(4, 64)
        for _ in range(3):
            launcher(4, 2, *_args(x))
        assert len(jit.calls) == 3
        assert launcher.compiled == {}


def test_cache_is_bounded_and_skips_kernels_with_pre_run_hooks(monkeypatch: Any) -> None:
    monkeypatch.setattr(direct, "MAX_ENTRIES", 2)
    jit = _Jit()
    launcher = _launcher(jit)
    for hidden in (16, 32, 48, 16, 32, 48):
        launcher(1, 1, *_args(torch.zeros(1, hidden)))
    assert len(launcher.compiled) == 2
    assert len(jit.calls) == 4  # 16, 32 cached; 48 never is
    hooked = _Jit()
    hooked.pre_run_hooks.append(lambda *a, **k: None)
    launcher = _launcher(hooked)
    for _ in range(2):
        launcher(1, 1, *_args(torch.zeros(1, 16)))
    assert len(hooked.calls) == 2


def test_launch_configs_are_computed_once() -> None:
    first = launch.launch_config(3000, 2, batch_invariant=False)
    assert launch.launch_config(3000, 2, batch_invariant=False) is first
    assert first == launch.LaunchConfig(block=4096, single_pass=True, num_warps=8)
