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
from pathlib import Path

import pytest
from vllm_ir.compilation._fingerprint import code_fingerprint

CHILD = textwrap.dedent(
    """
    import importlib, json, os, sys, torch
    from torch import Tensor
    import vllm_ir as ir
    import cache_key_helper

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

    programs = {
        "norm": (lambda x, w: ir.ops.rms_norm(x, w, 1e-6), {"rms_norm": ["cache_key_fast"]}),
        "helper": (lambda x, w: scale(x) * w, {"cache_key_scale": ["cache_key_provider"]}),
    }

    def compile_all():
        report = {}
        for name, (f, prio) in programs.items():
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
            helper.write("def helper(x):\\n    return x * 2\\n")
        importlib.reload(cache_key_helper)
        reports.append(compile_all())
    print(json.dumps(reports))
    """
)


def _run(tmp: Path, *, then_change: bool = False) -> list[dict[str, dict[str, object]]]:
    """The child's reports: one per round of compiles (two with ``then_change``)."""
    (tmp / "cache_key_helper.py").write_text("def helper(x):\n    return x * 1\n")
    env = {
        **os.environ,
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
    (tmp_path / "child.py").write_text(CHILD)
    (first,) = _run(tmp_path)
    assert all(r["equal"] and r["from_cache"] == [False] for r in first.values()), first
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
