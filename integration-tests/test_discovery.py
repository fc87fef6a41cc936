"""Provider discovery end to end, against installed wheels.

``nox -s integration`` builds every package under ``packages/`` and the three
provider packages next to this file, and installs them together. In-process
tests run under the allow-list set in ``conftest.py``; subprocess tests start
discovery afresh in their own environment.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import torch
import vllm_ir as ir
import vllm_ir_broken
import vllm_ir_example
import vllm_ir_incompatible
from vllm_ir.testing import ENTRY_POINT_GROUP

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
EXAMPLE_PACKAGE = "vllm-ir-example-provider 0.1.0"
EPS = 1e-6
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter whose only ``VLLM_*`` variables are ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr}"
    return proc


def rms_args(variance_size: int | None = None) -> tuple[Any, ...]:
    x, w = torch.randn(4, 96), 1.0 + 0.1 * torch.randn(96)
    return (x, w, EPS) if variance_size is None else (x, w, EPS, variance_size)


def prefixed(name: str) -> Callable[[str], str]:
    """An ``assert_close`` message that keeps its mismatch report and names the sample."""
    return lambda message: f"{name}: {message}"


# -- the wheels -----------------------------------------------------------


def test_packages_are_imported_from_installed_wheels() -> None:
    # an editable install or a sys.path entry into the checkout would test sources, not wheels
    for module in (ir, vllm_ir_example, vllm_ir_broken, vllm_ir_incompatible):
        path = Path(module.__file__ or "").resolve()
        assert "site-packages" in path.parts, f"{module.__name__} imported from {path}"
        assert not path.is_relative_to(REPO / "packages"), path
        assert not path.is_relative_to(HERE), path


@pytest.mark.skipif("VLLM_IR_WHEEL_DIR" not in os.environ, reason="set by nox -s integration")
def test_every_built_wheel_is_installed_at_its_version() -> None:
    wheels = sorted(Path(os.environ["VLLM_IR_WHEEL_DIR"]).glob("*.whl"))
    built = dict(w.name.split("-")[:2] for w in wheels)
    assert {"vllm_ir_core", "vllm_ir_example_provider"} <= built.keys()
    installed = {name: metadata.version(name) for name in built}
    assert installed == built


def test_example_wheel_ships_py_typed() -> None:
    assert (Path(vllm_ir_example.__file__ or "").parent / "py.typed").is_file()


# -- the example provider ---------------------------------------------------


def test_example_provider_is_discovered() -> None:
    loaded = ir.loaded_providers()["example"]
    assert loaded.package == EXAMPLE_PACKAGE
    assert loaded.spec is vllm_ir_example.provider
    assert loaded.spec.api_version == ir.provider.API_VERSION


def test_impls_are_attributed_to_the_example_package() -> None:
    rms = ir.ops.rms_norm.impls["example"]
    fused = ir.ops.fused_add_rms_norm.impls["example"]
    assert (rms.package, rms.inplace) == (EXAMPLE_PACKAGE, False)
    assert (fused.package, fused.inplace) == (EXAMPLE_PACKAGE, True)


def test_platform_defaults_are_applied() -> None:
    assert ir.ops.rms_norm.get_priority() == ["example", "native"]
    assert ir.ops.fused_add_rms_norm.get_priority() == ["example", "native"]
    assert ir.ops.rms_norm.get_priority("compiled")[0] == "native"
    # the provenance names the contributing package
    source = ir.ops.rms_norm.get_priority_entries()[0].source
    assert "cpu eager default" in source
    assert "vllm-ir-example-provider" in source


def test_eager_dispatch_picks_example() -> None:
    assert ir.ops.rms_norm.selected_impl(*rms_args()).provider == "example"


def test_declined_arguments_fall_back_to_native() -> None:
    args = rms_args(variance_size=64)
    assert ir.ops.rms_norm.selected_impl(*args).provider == "native"
    first, *_, chosen = ir.ops.rms_norm.select(*args).decisions
    assert (first.entry.provider, first.accepted) == ("example", False)
    assert "supports_args" in first.reason
    assert (chosen.entry.provider, chosen.accepted) == ("native", True)
    torch.testing.assert_close(ir.ops.rms_norm(*args), ir.ops.rms_norm.native(*args))


def test_maybe_inplace_reuses_the_donated_storage() -> None:
    op = ir.ops.fused_add_rms_norm
    x, residual, w = torch.randn(4, 64), torch.randn(4, 64), torch.randn(64)
    expected = op.native(x.clone(), residual.clone(), w, EPS)
    assert op.selected_impl(x, residual, w, EPS).inplace
    out, new_residual = op.maybe_inplace(x, residual, w, EPS)
    assert out.data_ptr() == x.data_ptr()
    assert new_residual.data_ptr() == residual.data_ptr()
    torch.testing.assert_close((out, new_residual), expected)


def test_default_overload_leaves_inputs_untouched() -> None:
    op = ir.ops.fused_add_rms_norm
    x, residual, w = torch.randn(4, 64), torch.randn(4, 64), torch.randn(64)
    x0, residual0 = x.clone(), residual.clone()
    assert op.selected_impl(x, residual, w, EPS).inplace  # the impl that would mutate them
    out, new_residual = op(x, residual, w, EPS)
    assert torch.equal(x, x0)
    assert torch.equal(residual, residual0)
    assert out.data_ptr() != x.data_ptr()
    assert new_residual.data_ptr() != residual.data_ptr()
    torch.testing.assert_close((out, new_residual), op.native(x0, residual0, w, EPS))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op_name", ["rms_norm", "fused_add_rms_norm"])
def test_example_matches_native_on_sample_inputs(op_name: str, dtype: torch.dtype) -> None:
    op = ir.get_op(op_name)
    tol = op.tolerance(dtype)
    ran_example = 0
    for sample in op.sample_inputs(dtype):
        bound = op.signature.bind(*sample.args)
        declined = bound.arguments.get("variance_size") is not None
        provider = op.selected_impl(*sample.args).provider
        assert provider == ("native" if declined else "example"), sample.name
        ran_example += provider == "example"
        expected = op.native(*sample.clone().args)
        calls: list[Callable[..., Any]] = [op, op.maybe_inplace] if op.allow_inplace else [op]
        for call in calls:
            actual = call(*sample.clone().args)
            torch.testing.assert_close(
                actual, expected, atol=tol.atol, rtol=tol.rtol, msg=prefixed(sample.name)
            )
    assert ran_example > 0, "no sample exercised the example impl"


# -- providers that must not load -----------------------------------------


def test_broken_provider_is_reported_with_its_cause() -> None:
    error = ir.load_errors()["broken"]
    assert error.package == "vllm-ir-broken-provider 0.1.0"
    assert error.cause == f"RuntimeError: {vllm_ir_broken.FAILURE}"
    assert "broken" not in ir.loaded_providers()


def test_broken_provider_registration_is_rolled_back() -> None:
    ir.load_errors()  # discovery has run
    assert vllm_ir_broken.REGISTERED == ["rms_norm"], "register() did not get to register"
    assert "broken" not in ir.ops.rms_norm.impls
    assert "broken" not in ir.ops.rms_norm.get_priority()  # its defaults were dropped
    args = rms_args()
    torch.testing.assert_close(ir.ops.rms_norm(*args), ir.ops.rms_norm.native(*args))


def test_incompatible_provider_is_refused_naming_both_versions() -> None:
    error = ir.load_errors()["incompatible"]
    assert error.package == "vllm-ir-incompatible-provider 0.1.0"
    assert re.search(rf"\bAPI {vllm_ir_incompatible.API_VERSION}\b", error.cause), error.cause
    assert re.search(rf"\bAPI {ir.provider.API_VERSION}\b", error.cause), error.cause
    assert vllm_ir_incompatible.register_calls == []
    assert "incompatible" not in ir.loaded_providers()


# -- fresh processes ----------------------------------------------------------

ALLOW_LIST_PROBE = """
import json, sys
import vllm_ir_example
kernels_imported = "vllm_ir_example._kernels" in sys.modules
import torch
import vllm_ir as ir
x, w = torch.randn(4, 64), torch.ones(64)
print(json.dumps({
    "kernels_imported_by_import": kernels_imported,
    "loaded": {name: p.package for name, p in ir.loaded_providers().items()},
    "errors": sorted(ir.load_errors()),
    "fixtures_imported": sorted(
        m for m in ("vllm_ir_broken", "vllm_ir_incompatible") if m in sys.modules
    ),
    "eager": {op: ir.get_op(op).get_priority() for op in ("rms_norm", "fused_add_rms_norm")},
    "compiled": ir.ops.rms_norm.get_priority("compiled"),
    "selected": ir.ops.rms_norm.selected_impl(x, w, 1e-6).provider,
    "selected_variance": ir.ops.rms_norm.selected_impl(x, w, 1e-6, 32).provider,
}))
"""


@pytest.fixture(scope="module")
def allow_listed() -> tuple[dict[str, Any], str]:
    proc = run_python(ALLOW_LIST_PROBE, VLLM_IR_PROVIDERS="example", VLLM_IR_PLATFORM="cpu")
    return json.loads(proc.stdout), proc.stderr


def test_allow_list_loads_only_the_named_provider(allow_listed: tuple[dict[str, Any], str]) -> None:
    report, _ = allow_listed
    installed = {ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    assert {"broken", "incompatible"} <= installed  # else skipping them proves nothing
    assert report["loaded"] == {"example": EXAMPLE_PACKAGE}
    assert report["errors"] == []
    assert report["fixtures_imported"] == [], "skipped providers must not even be imported"


def test_defaults_and_selection_in_a_fresh_process(
    allow_listed: tuple[dict[str, Any], str],
) -> None:
    report, _ = allow_listed
    assert report["eager"] == {
        "rms_norm": ["example", "native"],
        "fused_add_rms_norm": ["example", "native"],
    }
    assert report["compiled"][0] == "native"
    assert (report["selected"], report["selected_variance"]) == ("example", "native")


def test_importing_the_provider_registers_nothing(allow_listed: tuple[dict[str, Any], str]) -> None:
    report, _ = allow_listed
    assert report["kernels_imported_by_import"] is False


def test_selections_are_not_logged_by_default(allow_listed: tuple[dict[str, Any], str]) -> None:
    _, stderr = allow_listed
    assert "selected" not in stderr, stderr


DEBUG_PROBE = """
import json
from collections.abc import Callable
from importlib import metadata
import torch
import vllm_ir as ir
x, w = torch.randn(4, 64), torch.ones(64)
# named explicitly so the log does not depend on which other providers are installed
with ir.ops.rms_norm.set_priority(["example", "native"]):
    ir.ops.rms_norm(x, w, 1e-6)
    ir.ops.rms_norm(x, w, 1e-6, 32)
print(json.dumps({
    "installed": sorted(ep.name for ep in metadata.entry_points(group="vllm_ir.providers")),
    "loaded": sorted(ir.loaded_providers()),
    "errors": sorted(ir.load_errors()),
}))
"""


@pytest.fixture(scope="module")
def debug_run() -> tuple[dict[str, Any], str]:
    # no allow-list: every installed provider, from packages/ too, loads together
    proc = run_python(DEBUG_PROBE, VLLM_LOGGING_LEVEL="DEBUG", VLLM_IR_PLATFORM="cpu")
    return json.loads(proc.stdout), proc.stderr


def test_all_installed_providers_coexist(debug_run: tuple[dict[str, Any], str]) -> None:
    report, _ = debug_run
    assert "example" in report["loaded"]
    assert {"broken", "incompatible"} <= set(report["errors"])
    assert set(report["loaded"]) | set(report["errors"]) == set(report["installed"])


def test_debug_logs_the_selection(debug_run: tuple[dict[str, Any], str]) -> None:
    _, stderr = debug_run
    assert re.search(r"rms_norm \(eager\): selected example\b", stderr), stderr


def test_debug_logs_rejections_with_their_reason(debug_run: tuple[dict[str, Any], str]) -> None:
    _, stderr = debug_run
    rejected = re.search(r"rms_norm \(eager\): rejected example\b.*", stderr)
    assert rejected, stderr
    assert "supports_args returned False" in rejected[0], stderr
    assert re.search(r"rms_norm \(eager\): selected native\b", stderr), stderr


def test_failed_providers_are_logged(debug_run: tuple[dict[str, Any], str]) -> None:
    _, stderr = debug_run
    assert re.search(r"provider 'broken' .*failed to load.*simulated failure", stderr), stderr
    assert re.search(r"provider 'incompatible' .*failed to load.*API 999", stderr), stderr
