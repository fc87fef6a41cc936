"""Run CI's nox sessions in parallel lanes: what ``.ci/run`` calls.

Every default session (``nox -l`` marks them ``*``) and the ``vllm`` session
run, each exactly as ``nox -s NAME`` runs it, but up to ``--lanes`` (default
2, ``VLLM_IR_CI_LANES``) at a time. On a two-core machine the sessions are
rarely CPU-bound end to end: venv creation and installs, pytest collection,
xdist's tail, wheel builds and the integration test's ``pip install`` leave a
core idle that another session's tests fill.

With two lanes the cores are busy, so a second pytest-xdist worker buys a
session little and costs it another interpreter's imports and collection:
every session but core's runs one worker (``VLLM_IR_TEST_WORKERS=1``) unless
that variable is set. Measured with warm caches: ``tests(vllm-ir-xpu)`` 57
CPU-seconds with two workers, 40 with one; ``tests(vllm-ir-rocm)`` 60 and 37.
Core's suite, the longest job, keeps two.

Jobs start longest first (``ORDER``, from measured CI times) so the short
ones fill the end. ``build`` and ``integration`` run as one job, in that
order, because integration reuses the wheels build made in the same nox
process. Each job's output goes to ``.cache/ci/<job>.log`` and is printed
whole when the job ends, so logs never interleave; a line per start and end
gives the timeline. The exit status is 1 if any job failed (all jobs run).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / ".cache" / "ci"

ORDER = (
    "tests(package='vllm-ir-core')",
    "vllm_engine",
    "torch_matrix",
    "build",
    "tests(package='vllm-ir-cpu')",
    "tests(package='vllm-ir-triton')",
    "tests(package='vllm-ir-cuda')",
    "vllm(version='0.34.0')",
    "vllm(version='0.33.0')",
    "tests(package='vllm-ir-transformers')",
)
"""Sessions to start first, longest first (a parametrized session's base name ranks
each instance); unnamed ones follow in nox's order."""

TOGETHER = {"build": ("build", "integration")}
"""A job that runs several sessions in one nox process, in this order."""

TWO_WORKERS = ("tests(package='vllm-ir-core')",)
"""Jobs that keep one xdist worker per core while other lanes run."""

EXTRA = ("vllm", "torch_matrix", "vllm_engine")
"""Not default sessions, run in CI all the same (``vllm`` installs vLLM's wheel;
``torch_matrix`` is one job per torch version): a name or a parametrized
session's base name."""


@dataclass
class Job:
    sessions: tuple[str, ...]
    name: str
    log: Path = field(init=False)
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0

    def __post_init__(self) -> None:
        self.log = LOGS / (re.sub(r"[^\w.-]+", "_", self.name).strip("_") + ".log")


def listed_sessions(nox: list[str]) -> tuple[list[str], list[str]]:
    """(the default sessions, every other session), as ``nox -l`` lists them."""
    listed = subprocess.run([*nox, "-l"], capture_output=True, text=True, check=True, cwd=ROOT)
    found = re.findall(r"^([*-]) (\S+) ->", listed.stdout, re.MULTILINE)
    return [n for mark, n in found if mark == "*"], [n for mark, n in found if mark == "-"]


def extra_sessions(others: list[str]) -> list[str]:
    """The sessions of :data:`EXTRA` among ``others`` (parametrized ones: each instance)."""
    return [n for n in others if any(n == e or n.startswith(f"{e}(") for e in EXTRA)]


def plan(sessions: list[str], extra: list[str] | None = None) -> list[Job]:
    """The jobs for ``sessions`` plus ``extra`` (default: :data:`EXTRA`), longest first."""
    extra = list(EXTRA) if extra is None else extra
    wanted = [*sessions, *(s for s in extra if s not in sessions)]
    grouped = {member for group in TOGETHER.values() for member in group}
    jobs = []
    for name in wanted:
        if name in TOGETHER:
            jobs.append(Job(tuple(s for s in TOGETHER[name] if s in wanted), name))
        elif name not in grouped:
            jobs.append(Job((name,), name))
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(
        jobs, key=lambda job: rank.get(job.name, rank.get(job.name.split("(")[0], len(ORDER)))
    )


def _start(job: Job, nox: list[str], lanes: int) -> None:
    env = dict(os.environ)
    if lanes > 1 and job.name not in TWO_WORKERS:
        env.setdefault("VLLM_IR_TEST_WORKERS", "1")
    job.log.parent.mkdir(parents=True, exist_ok=True)
    with job.log.open("wb") as out:
        job.proc = subprocess.Popen(
            [*nox, "-s", *job.sessions], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env
        )
    job.started = time.monotonic()
    workers = env.get("VLLM_IR_TEST_WORKERS", "default")
    print(f"[ci] start {' '.join(job.sessions)} (xdist workers: {workers})", flush=True)


def run(jobs: list[Job], nox: list[str], lanes: int) -> int:
    """Run ``jobs`` with at most ``lanes`` at once; the number that failed."""
    pending, running, failed = list(jobs), list[Job](), 0
    began = time.monotonic()
    while pending or running:
        while pending and len(running) < lanes:
            job = pending.pop(0)
            _start(job, nox, lanes)
            running.append(job)
        time.sleep(0.5)
        for job in [j for j in running if j.proc is not None and j.proc.poll() is not None]:
            running.remove(job)
            assert job.proc is not None
            took = time.monotonic() - job.started
            status = "ok" if job.proc.returncode == 0 else f"FAILED (exit {job.proc.returncode})"
            failed += job.proc.returncode != 0
            sys.stdout.write(job.log.read_text(errors="replace"))
            print(f"[ci] {status}: {' '.join(job.sessions)} in {took:.0f} s", flush=True)
    print(f"[ci] {len(jobs) - failed}/{len(jobs)} jobs ok in {time.monotonic() - began:.0f} s")
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--lanes",
        type=int,
        default=int(os.environ.get("VLLM_IR_CI_LANES", "2")),
        help="jobs at once (default 2, VLLM_IR_CI_LANES)",
    )
    parser.add_argument("--plan", action="store_true", help="print the jobs and exit")
    parser.add_argument(
        "sessions", nargs="*", help="run only these (nox -l names; default: all, vllm too)"
    )
    args = parser.parse_args(argv)
    if args.lanes < 1:
        parser.error(f"--lanes must be at least 1, got {args.lanes}")
    nox = [sys.executable, "-m", "nox"]
    defaults, others = listed_sessions(nox)
    jobs = plan(defaults, extra_sessions(others))
    if args.sessions:
        chosen = set(args.sessions)
        jobs = [job for job in jobs if chosen & set(job.sessions)]
        for job in jobs:
            job.sessions = tuple(s for s in job.sessions if s in chosen)
    if args.plan:
        for job in jobs:
            print(" ".join(job.sessions))
        return 0
    return 1 if run(jobs, nox, args.lanes) else 0


if __name__ == "__main__":
    sys.exit(main())
