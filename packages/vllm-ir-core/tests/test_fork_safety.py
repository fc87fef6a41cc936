"""A child forked while another thread holds vllm-ir's locks never hangs.

Each case runs in a fresh interpreter (discovery runs once per process) that
forks; the parent kills a child still running after a few seconds, and the
whole subprocess has a timeout, so a regression fails instead of hanging.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

# the forked child gets CHILD_SECONDS to finish its first op call
_WAIT_FOR_CHILD = """
def wait_for(pid, seconds):
    import os, time
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "hung"
"""


def _run(script: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM")}
    env["VLLM_IR_PROVIDERS"] = "none"
    result = subprocess.run(
        [sys.executable, "-c", _WAIT_FOR_CHILD + textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_child_forked_during_discovery_discovers_again() -> None:
    # another thread is inside a provider's register() when the process forks:
    # the child must not wait for that thread's lock, and must not keep the
    # provider's half-made registrations
    out = _run(
        """
        import os, threading, time, torch, vllm_ir as ir
        from torch import Tensor
        from vllm_ir._discovery import providers

        started = threading.Event()
        loads = []

        def register():
            loads.append(os.getpid())
            @ir.ops.rms_norm.register_impl("slow_kernel")
            def slow_kernel(
                x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
            ) -> Tensor:
                return ir.ops.rms_norm.native(x, weight, epsilon, variance_size)
            started.set()
            time.sleep(1.5 if os.getpid() == parent else 0)

        spec = ir.provider.ProviderSpec(
            name="slow", api_version=ir.provider.API_VERSION, register=register
        )
        providers._discover = lambda: providers.load_provider("slow", "slow 0.1", spec)
        parent = os.getpid()
        threading.Thread(target=providers.ensure_loaded, daemon=True).start()
        started.wait(10)
        pid = os.fork()
        if pid == 0:
            # in the child: the half-registered impl is gone until discovery reruns
            impls_before = "slow_kernel" in ir.ops.rms_norm.registered_impls
            ir.ops.rms_norm(torch.ones(2, 8), None, 1e-6)
            ok = not impls_before and loads.count(os.getpid()) == 1
            ok = ok and "slow_kernel" in ir.ops.rms_norm.impls
            os._exit(0 if ok else 3)
        print("CHILD", wait_for(pid, 20))
        """
    )
    assert "CHILD 0" in out, out


def test_child_forked_while_another_thread_holds_the_cache_lock() -> None:
    # deterministic stand-in for a fork in the middle of an invalidation
    out = _run(
        """
        import os, threading, torch, vllm_ir as ir
        from vllm_ir._base import cache
        from vllm_ir._base.runtime import RUNTIME

        op = ir.ops.rms_norm
        op(torch.ones(2, 8), None, 1e-6)
        held, release = threading.Event(), threading.Event()

        def hold():
            with RUNTIME.caches.lock:
                held.set()
                release.wait(30)

        threading.Thread(target=hold, daemon=True).start()
        held.wait(10)
        generation = cache.generation()
        pid = os.fork()
        if pid == 0:
            op(torch.ones(3, 16), None, 1e-6)  # a new key: a miss stores under the lock
            ir.invalidate_caches()
            os._exit(0 if cache.generation() > generation else 3)
        status = wait_for(pid, 20)
        release.set()
        print("CHILD", status)
        """
    )
    assert "CHILD 0" in out, out


def test_one_after_fork_hook_renews_every_lock_of_the_runtime() -> None:
    """Every lock the runtime holds is new in a child forked while other threads held them."""
    out = _run(
        """
        import os, threading, torch, vllm_ir as ir
        from vllm_ir._base.runtime import RUNTIME

        locks = [RUNTIME.caches.lock, RUNTIME.discovery.lock, RUNTIME.priorities.scope_lock,
                 RUNTIME.priorities.intern_lock, RUNTIME.platforms.lock,
                 RUNTIME.compiled_eager.lock]
        held, release = threading.Event(), threading.Event()

        def hold():
            for lock in locks:
                lock.acquire()
            held.set()
            release.wait(30)

        threading.Thread(target=hold, daemon=True).start()
        held.wait(10)
        pid = os.fork()
        if pid == 0:
            renewed = [
                RUNTIME.caches.lock, RUNTIME.discovery.lock, RUNTIME.priorities.scope_lock,
                RUNTIME.priorities.intern_lock, RUNTIME.platforms.lock,
                RUNTIME.compiled_eager.lock,
            ]
            assert all(a is not b for a, b in zip(locks, renewed))
            ir.invalidate_caches()
            with ir.ops.rms_norm.set_priority(["native"]):
                ir.ops.rms_norm(torch.ones(2, 8), None, 1e-6)
            os._exit(0)
        status = wait_for(pid, 20)
        release.set()
        print("CHILD", status)
        """
    )
    assert "CHILD 0" in out, out
