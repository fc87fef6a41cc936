"""Inductor's FX graph cache never serves a graph lowered under other selection
inputs: two processes share a cache directory (torch.compile's default), and
the second changes ``VLLM_BATCH_INVARIANT`` or the helper module an impl calls.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import vllm_ir as ir
from torch._subclasses.fake_tensor import FakeTensorMode
from vllm_ir._base.fingerprint import code_fingerprint

CHILD = textwrap.dedent(
    """
    import importlib, json, os, sys, torch
    from torch import Tensor
    import vllm_ir as ir
    import cache_key_helper
    from cache_key_helper import SCALER

    CFG = {"k": cache_key_helper.K}

    @ir.ops.rms_norm.register_impl("cache_key_fast")
    def fast(x: Tensor, weight: Tensor | None, epsilon: float,
             variance_size: int | None = None) -> Tensor:
        return ir.ops.rms_norm.native(x, weight, epsilon, variance_size) + 0.5

    @ir.register_op(name="cache_key_scale")
    def scale(x: Tensor) -> Tensor:
        return x * 1

    @scale.register_impl("cache_key_provider")
    def scale_provider(x: Tensor) -> Tensor:
        return cache_key_helper.helper(x) + 0

    @scale.register_impl("cache_key_state")  # K reached through an object and a dict
    def scale_state(x: Tensor) -> Tensor:
        return SCALER.apply(x) * CFG["k"]

    programs = {
        "norm": (lambda x, w: ir.ops.rms_norm(x, w, 1e-6), {"rms_norm": ["cache_key_fast"]}),
        "helper": (lambda x, w: scale(x) * w, {"cache_key_scale": ["cache_key_provider"]}),
        "state": (lambda x, w: scale(x) * w, {"cache_key_scale": ["cache_key_state"]}),
    }
    only = os.environ["CACHE_KEY_PROGRAMS"].split(",")

    def compile_all():
        report = {}
        for name, (f, prio) in programs.items():
            if name not in only:
                continue
            torch._dynamo.reset()
            args = (torch.ones(4, 8), torch.ones(8))
            backend = ir.VllmIRBackend(priority=prio)
            with torch.no_grad():
                got = torch.compile(f, backend=backend)(*args)
            op = ir.IrOp.registry[next(iter(prio))]
            with op.set_priority(prio[op.name]):
                want = f(*args)
            report[name] = {
                "equal": torch.equal(got, want),
                "from_cache": [c.from_cache for c in backend.pass_contexts],
            }
        return report

    reports = [compile_all()]
    if sys.argv[1:] == ["--then-change"]:
        # batch invariance on, and the helper's code changed (as a user edits it)
        os.environ["VLLM_BATCH_INVARIANT"] = "1"
        ir.invalidate_caches()
        with open(cache_key_helper.__file__, "w") as helper:
            helper.write(HELPER.replace("x * 1", "x * 2"))
        importlib.reload(cache_key_helper)
        reports.append(compile_all())
    print(json.dumps(reports))
    """
)


# K comes from the environment: the file stays the same when K changes
HELPER = """import os
K = float(os.environ.get("CACHE_KEY_K", "1"))
def helper(x):
    return x * 1
class Scaler:
    def apply(self, x):
        return x * K
SCALER = Scaler()
"""


def _run(
    tmp: Path, *, then_change: bool = False, programs: str = "norm,helper", k: float = 1
) -> list[dict[str, dict[str, object]]]:
    """The child's reports: one per round of compiles (two with ``then_change``)."""
    (tmp / "cache_key_helper.py").write_text(HELPER)
    env = {
        **os.environ,
        "CACHE_KEY_PROGRAMS": programs,
        "CACHE_KEY_K": str(k),
        "VLLM_IR_PROVIDERS": "none",
        "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
        "PYTHONPATH": str(tmp),
        "VLLM_BATCH_INVARIANT": "0",
        "PYTHONDONTWRITEBYTECODE": "1",  # the helper's edit must not meet a stale .pyc
    }
    env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
    proc = subprocess.run(
        [sys.executable, str(tmp / "child.py"), *(["--then-change"] if then_change else [])],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_graph_cache_key_covers_batch_invariance_and_helper_code(tmp_path: Path) -> None:
    (tmp_path / "child.py").write_text(CHILD.replace("HELPER", repr(HELPER)))
    (first,) = _run(tmp_path, programs="norm,helper,state")
    assert all(r["equal"] and r["from_cache"] == [False] for r in first.values()), first
    # another K, the same files (compile-v4 r05): the impl reads it through an
    # object's method and a dict, so the key changes and the graph is lowered anew
    (other_k,) = _run(tmp_path, programs="state", k=2)
    assert other_k["state"] == {"equal": True, "from_cache": [False]}, other_k
    # a second process, the same inputs: served from the cache (the key is stable
    # across processes); then batch invariance on and the helper's code changed
    # in that process: both lowered anew
    again, changed = _run(tmp_path, then_change=True)
    assert all(r["equal"] and r["from_cache"] == [True] for r in again.values()), again
    assert all(r["equal"] and r["from_cache"] == [False] for r in changed.values()), changed


def test_fingerprint_follows_helpers_modules_and_closures(tmp_path: Path) -> None:
    module = tmp_path / "fingerprint_helper_mod.py"
    module.write_text("def helper(x):\n    return x * 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import fingerprint_helper_mod  # type: ignore[import-not-found]

        def impl(x: int) -> int:
            return fingerprint_helper_mod.helper(x)

        before = code_fingerprint(impl)
        assert code_fingerprint(impl) == before
        module.write_text("def helper(x):\n    return x * 2   # changed\n")
        assert code_fingerprint(impl) != before
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("fingerprint_helper_mod", None)

    def make(limit: int):  # type: ignore[no-untyped-def]
        return lambda x: x.shape[-1] <= limit

    assert code_fingerprint(make(8)) != code_fingerprint(make(16))


_LAZY_KERNELS = """
__vllm_ir_caches__ = {caches}
_library = None
SCALE = 2

def _load():
    global _library
    _library = object()

def impl(x):
    if _library is None:
        _load()
    return x * SCALE
"""


@pytest.mark.parametrize("declared", [True, False])
def test_declared_caches_leave_the_fingerprint(tmp_path: Path, declared: bool) -> None:
    """A module's ``__vllm_ir_caches__`` (a kernel library loaded on first call) is
    not hashed: one impl keeps one fingerprint across its first call; anything
    else the code reads still is."""
    caches = ("_library",) if declared else ()
    (tmp_path / "lazy_kernels_mod.py").write_text(_LAZY_KERNELS.format(caches=caches))
    sys.path.insert(0, str(tmp_path))
    try:
        import lazy_kernels_mod  # type: ignore[import-not-found]

        before = code_fingerprint(lazy_kernels_mod.impl)
        assert lazy_kernels_mod.impl(3) == 6  # loads the "library"
        assert (code_fingerprint(lazy_kernels_mod.impl) == before) is declared
        lazy_kernels_mod.SCALE = 3
        assert code_fingerprint(lazy_kernels_mod.impl) != before
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("lazy_kernels_mod", None)


class _Scaler:
    def __init__(self, k: float) -> None:
        self.k = k

    def apply(self, x: float) -> float:
        return x * self.k * FACTOR


FACTOR = 1.0
SCALER = _Scaler(2.0)
SETTINGS = {"k": 2.0}
TABLE = torch.tensor([2.0])


def test_fingerprint_follows_objects_dicts_and_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """compile-v4 r05: an object's state, the methods the code calls on it and the
    globals they read, a dict's items and a tensor's values are in the key."""

    def through_object(x: float) -> float:
        return SCALER.apply(x)

    def through_dict(x: float) -> float:
        return x * SETTINGS["k"]

    def through_tensor(x: torch.Tensor) -> torch.Tensor:
        return x * TABLE

    module = sys.modules[__name__]
    for impl, change in [
        (through_object, lambda: monkeypatch.setattr(SCALER, "k", 3.0)),
        (through_object, lambda: monkeypatch.setattr(module, "FACTOR", 3.0)),
        (through_dict, lambda: monkeypatch.setitem(SETTINGS, "k", 3.0)),
        (through_tensor, lambda: monkeypatch.setattr(module, "TABLE", torch.tensor([3.0]))),
    ]:
        before = code_fingerprint(impl)
        assert before is not None
        assert code_fingerprint(impl) == before
        change()
        assert code_fingerprint(impl) != before, impl.__name__
        monkeypatch.undo()
        assert code_fingerprint(impl) == before, impl.__name__


def test_fingerprint_is_the_same_in_every_process() -> None:
    """Sets iterate in an order that depends on PYTHONHASHSEED; the key must not."""
    script = textwrap.dedent(
        """
        from vllm_ir._base.fingerprint import code_fingerprint
        NAMES = {"q", "k", "v", "o"}
        def impl(x):
            return x in {"a", "b", "c"} or x in NAMES
        print(code_fingerprint(impl))
        """
    )
    prints = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(prints) == 1, prints


def test_what_cannot_be_fingerprinted_is_never_cached(make_op: Callable[..., ir.IrOp]) -> None:
    """A value the fingerprint cannot hash soundly (here a FakeTensor: no values)
    makes the lowering's uuid None, so Inductor compiles without its cache."""
    fake = FakeTensorMode().from_tensor(torch.ones(2))

    def scale(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    op = make_op(scale)

    @op.register_impl("unhashable")
    def _reads_fake(x: torch.Tensor) -> torch.Tensor:
        return x * fake

    assert code_fingerprint(_reads_fake) is None
    assert ir.VllmIRBackend(priority={op.name: ["unhashable"]}).lowering_pass.pre.uuid() is None
    assert ir.VllmIRBackend(priority={op.name: ["native"]}).lowering_pass.pre.uuid() is not None
