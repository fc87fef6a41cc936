"""The vllm-ir command, end to end in subprocesses (as a user runs it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def vllm_ir(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    result = subprocess.run(
        [sys.executable, "-m", "vllm_ir", *args], capture_output=True, text=True, env=env
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.mark.slow
def test_ops_lists_every_op_and_provider() -> None:
    out = vllm_ir("ops").stdout
    assert "platform: cpu" in out
    rows = [line.split() for line in out.splitlines()]
    assert ["fused_add_rms_norm", "native", "yes", "no", "yes"] in [r[:5] for r in rows]
    assert ["rms_norm", "native", "yes", "no", "yes"] in [r[:5] for r in rows]
    data = json.loads(vllm_ir("ops", "--json").stdout)
    rows = {(r["op"], r["provider"]): r for r in data["impls"]}
    assert rows[("rms_norm", "native")]["batch_invariant"] is True
    assert data["failed_providers"] == {} or isinstance(data["failed_providers"], dict)


@pytest.mark.slow
def test_explain_shows_sources_decisions_and_choice_per_mode() -> None:
    out = vllm_ir(
        "explain",
        "rms_norm",
        "--dtype",
        "fp32",
        "--shape",
        "4,64",
        "--arg",
        "variance_size=32",
        "--ir-op-priority.rms_norm=native",
    ).stdout
    assert "rms_norm(Tensor(float32, (4, 64), cpu), Tensor(float32, (64,), cpu), 1e-06, 32)" in out
    assert "eager mode" in out
    assert "compiled mode" in out
    assert "1. native  <- user (scoped)" in out
    assert out.count("selected: native") == 2
    only = vllm_ir("explain", "fused_add_rms_norm", "--compiled").stdout
    assert "eager mode" not in only
    assert "compiled mode" in only


def test_torch_wrap_flag_turns_trace_through_on_for_the_command() -> None:
    out = vllm_ir("explain", "rms_norm", "--eager", "--ir-torch-wrap", "off").stdout
    assert "torch wrap off (trace-through)" in out
    assert "trace-through" not in vllm_ir("explain", "rms_norm", "--eager").stdout


_LOADED_BY_EACH = """
import contextlib, io, json, sys
from vllm_ir_cli import main
loaded = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0, argv
    loaded.append([m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules])
print(json.dumps(loaded))
"""


def test_explain_and_tune_do_not_load_inductor(tmp_path: Path) -> None:
    # Inductor's import costs about 3 CPU-seconds a command: explain loads it
    # only for --tuned and --autotune, which measure compiled impls, and tune
    # imports the autotuner without the backend (vllm_ir.compilation is lazy)
    out = tmp_path / "tuned.json"
    argvs = [
        ["explain", "rms_norm"],
        ["tune", "--ops", "rms_norm", "--shapes", "a=4x64", "--runs", "1", "--out", str(out)],
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    result = subprocess.run(
        [sys.executable, "-c", _LOADED_BY_EACH, json.dumps(argvs)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == [[], []]
    assert json.loads(out.read_text())  # tune did write its table


BAD_INPUT = [
    (["explain", "no_such_op"], "unknown IR op 'no_such_op'; known ops:"),
    (["explain", "rms_norm", "--dtype", "int3"], "unknown dtype 'int3'"),
    (["explain", "rms_norm", "--shape", "8,x"], "malformed shape '8,x'"),
    (["explain", "rms_norm", "--shape", "0,8"], "every dimension must be positive"),
    (["explain", "rms_norm", "--arg", "nope=1"], "rms_norm has no parameter 'nope'"),
    (["--ir-op-priority.rms_norm=zzz", "ops"], "unknown provider(s) 'zzz' for op 'rms_norm'"),
    (["--ir-op-priority", "{bad", "ops"], "is not valid JSON"),
    (["bench", "rms_norm", "--dtypes", "fp8"], "unknown dtype 'fp8'"),
    (
        ["explain", "rms_norm", "--arg", "x=1"],
        "--arg x=1: x is a tensor argument of rms_norm; tensors are built from --shape",
    ),
    (
        ["explain", "rms_norm", "--arg", "weight=2"],
        "weight is a tensor argument of rms_norm (weight=None is accepted)",
    ),
    (
        ["explain", "rms_norm", "--arg", 'epsilon="a"'],
        "--arg epsilon='a': str does not fit rms_norm's epsilon (float)",
    ),
    (
        ["explain", "rms_norm", "--arg", "variance_size=1.5"],
        "float does not fit rms_norm's variance_size (int | None)",
    ),
    (["explain", "rms_norm", "--device", "cuda"], "--device cuda: torch"),
    (["explain", "rms_norm", "--device", "nonsense"], "unknown device 'nonsense'"),
    (["demo", "--tokens", "0"], "argument --tokens: must be a positive integer, got 0"),
    (["demo", "--hidden", "-1"], "argument --hidden: must be a positive integer, got -1"),
    (["demo", "--runs", "0"], "argument --runs: must be a positive integer, got 0"),
    (["demo", "--layers", "two"], "argument --layers: expected an integer, got 'two'"),
    (["bench", "rms_norm", "--rounds", "0"], "argument --rounds: must be a positive"),
    (["bench", "rms_norm", "--warmup", "-1"], "argument --warmup: must be an integer >= 0"),
    (
        ["bench", "rms_norm", "--json", "/nonexistent/x.json"],
        "--json /nonexistent/x.json: directory '/nonexistent' does not exist",
    ),
    (
        ["bench", "silu_and_mul", "--shapes", "4x7", "--no-compiled"],
        "silu_and_mul cannot take shape 4x7: silu_and_mul: x's last dimension (7) must be even",
    ),
    (  # explain checks the call as bench does: not "cpu_c selected" for a call all reject
        ["explain", "silu_and_mul", "--shape", "4,7"],
        "silu_and_mul cannot take shape 4x7: silu_and_mul: x's last dimension (7) must be even",
    ),
    (
        ["--ir-op-priority.rms_norm", "ops"],
        "--ir-op-priority.rms_norm expects a value before the command, got 'ops'",
    ),
    (["ops", "--ir-pass.fuse_norm_quant"], "--ir-pass.fuse_norm_quant expects a value"),
    (["--ir-pass.nope=on", "ops"], "unknown IR pass(es) 'nope'"),
    (["--ir-torch-wrap=maybe", "ops"], "--ir-torch-wrap takes on or off, got 'maybe'"),
    # sizes no memory holds: checked before allocating, never an allocator traceback
    (
        ["explain", "rms_norm", "--shape", "99999999999,99999999999", "--eager"],
        "rms_norm's arguments for shape 99999999999x99999999999 would take",
    ),
    (
        ["bench", "rms_norm", "--shapes", "99999999x99999999", "--dtypes", "fp32"],
        "GiB, more than the",
    ),
    (["demo", "--hidden", "99999999999"], "give a smaller --hidden, --layers or --tokens"),
    (["explain", "rms_norm", "--arg", "epsilon=" + "-" * 100_000 + "1"], "is not a Python literal"),
    (["tune", "--ops", "rms_norm", "--out", "/nonexistent/t.json"], "directory '/nonexistent'"),
    (["tune", "--ops", "rms_norm", "--out", "/"], "--out /: is a directory; give a file name"),
    (["frobnicate"], "argument COMMAND: invalid choice: 'frobnicate'"),
    ([], "the following arguments are required: COMMAND"),
]

# Every case runs in one interpreter, one after the other (importing torch once,
# not 30 times): each must fail alone, and a failed command must leave nothing
# behind that changes the next one.
_RUN_EACH = """
import contextlib, io, json, sys
from vllm_ir_cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def bad_input_results() -> list[tuple[int, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    argvs = json.dumps([argv for argv, _ in BAD_INPUT])
    result = subprocess.run(
        [sys.executable, "-c", _RUN_EACH, argvs], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return [(code, err) for code, err in json.loads(result.stdout.splitlines()[-1])]


@pytest.mark.parametrize(
    "case", range(len(BAD_INPUT)), ids=lambda i: " ".join(BAD_INPUT[i][0])[:80]
)
def test_bad_input_is_one_line_and_exit_2(
    bad_input_results: list[tuple[int, str]], case: int
) -> None:
    code, stderr = bad_input_results[case]
    assert code == 2, stderr
    assert BAD_INPUT[case][1] in stderr
    assert stderr.startswith("vllm-ir: error: ")
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert "Traceback" not in stderr


def _tune_document(**edits: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "ir_op_priority": {"rms_norm": ["cpu_c", "native"]},
        "measured": {
            "rms_norm": {
                "a": {
                    "shape": [4, 64],
                    "times_us": {"cpu_c": 1.0, "native": 2.0},
                    "winner": "cpu_c",
                }
            }
        },
        "dtype": "float32",
    }
    doc.update(edits)
    return doc


def _file_cases(tmp: Path) -> list[tuple[list[str], str]]:
    """Bad input that needs files: tune's output and device, --tuned and @FILE documents."""
    out = str(tmp / "t.json")
    tune = ["tune", "--ops", "rms_norm", "--shapes", "a=4x64", "--runs", "1"]
    (tmp / "adir").mkdir()
    files = {
        "measured-number.json": json.dumps(_tune_document(measured=5)),
        "no-priority.json": json.dumps(_tune_document(ir_op_priority={})),
        "no-times.json": json.dumps(
            _tune_document(measured={"rms_norm": {"a": {"shape": [4, 64], "winner": "native"}}})
        ),
        "deep.json": "[" * 100_000 + "]" * 100_000,
        "huge-time.json": json.dumps(
            _tune_document(
                measured={
                    "rms_norm": {
                        "a": {"shape": [4, 64], "times_us": {"cpu_c": 10**400}, "winner": "cpu_c"}
                    }
                }
            )
        ),
    }
    for name, text in files.items():
        (tmp / name).write_text(text)
    (tmp / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    tuned = ["explain", "rms_norm", "--shape", "4,64", "--eager", "--tuned"]
    return [
        ([*tune, "--out", str(tmp / "missing" / "t.json")], "does not exist; create it first"),
        ([*tune, "--out", str(tmp / "adir")], "is a directory; give a file name"),
        ([*tune, "--device", "cuda", "--out", out], "--device cuda: torch"),
        ([*tune, "--device", "junk", "--out", out], "unknown device 'junk'"),
        (
            ["tune", "--ops", "silu_and_mul", "--shapes", "a=4x7", "--out", out],
            "silu_and_mul cannot take shape 4x7",
        ),
        (
            ["tune", "--ops", "rms_norm", "--shapes", "a=99999999x99999999", "--out", out],
            "would take",
        ),
        ([*tuned, str(tmp / "measured-number.json")], "'measured' is not an object"),
        ([*tuned, str(tmp / "no-priority.json")], "rms_norm is measured but has no list"),
        ([*tuned, str(tmp / "no-times.json")], "'measured.rms_norm.a' has no 'times_us'"),
        ([*tuned, str(tmp / "deep.json")], "nested too deeply"),
        ([*tuned, str(tmp / "huge-time.json")], "has no 'times_us' object of numbers"),
        ([f"--ir-op-priority=@{tmp / 'binary.json'}", "ops"], "binary.json: the file is not UTF-8"),
    ]


@pytest.mark.slow
def test_bad_input_with_files_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Checked before any work: nothing measured, no temporary file left anywhere."""
    cases = _file_cases(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    argvs = json.dumps([argv for argv, _ in cases])
    result = subprocess.run(
        [sys.executable, "-c", _RUN_EACH, argvs], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout.splitlines()[-1])
    for (argv, expected), (code, stderr) in zip(cases, results, strict=True):
        assert code == 2, (argv, stderr)
        assert stderr.startswith("vllm-ir: error: "), (argv, stderr)
        assert expected in stderr, (argv, stderr)
        assert len(stderr.strip().splitlines()) == 1, (argv, stderr)
    assert sorted(tmp_path.rglob("*")) == before  # no .NAME.tmp, no t.json


def test_tune_leaves_no_temporary_file_when_writing_fails(tmp_path: Path) -> None:
    from vllm_ir._cli.args import UsageError, write_atomically

    target = tmp_path / "t.json"
    target.mkdir()  # os.replace onto a directory fails after the temporary file is written
    with pytest.raises(UsageError, match="cannot write"):
        write_atomically("--out", target, "{}")
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]
    write_atomically("--out", tmp_path / "u.json", "{}")
    assert (tmp_path / "u.json").read_text() == "{}"
    umask = os.umask(0)
    os.umask(umask)
    # an ordinary file, not mkstemp's private 0600
    assert oct((tmp_path / "u.json").stat().st_mode & 0o777) == oct(0o666 & ~umask)


def test_bad_input_through_the_command() -> None:
    """The same, as a user runs it: the exit status of the process."""
    result = vllm_ir("explain", "rms_norm", "--dtype", "int3", check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("vllm-ir: error: unknown dtype 'int3'")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.slow
def test_a_closed_pipe_ends_quietly() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    reader = subprocess.Popen(
        [sys.executable, "-m", "vllm_ir_cli", "explain", "rms_norm"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert reader.stdout is not None
    assert reader.stderr is not None
    reader.stdout.close()  # like `| head` that has read all it wants before the first line
    stderr = reader.stderr.read().decode()
    assert reader.wait() == 0
    assert stderr == ""


_NO_TORCH = """
import sys
from vllm_ir_cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as e:  # --help and --version exit through argparse
    status = e.code
print("torch imported:", "torch" in sys.modules, "vllm_ir imported:", "vllm_ir" in sys.modules)
sys.exit(status)
"""


@pytest.mark.parametrize(
    "args",
    [["--help"], ["--version"], ["demo", "--help"], ["demo", "--tokens", "0"], ["frobnicate"]],
)
def test_help_version_and_argument_errors_do_not_import_torch(args: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _NO_TORCH, *args], capture_output=True, text=True
    )
    assert "torch imported: False vllm_ir imported: False" in result.stdout, result.stderr


def test_the_console_script_is_the_torch_free_front_end() -> None:
    from importlib import metadata

    (script,) = [
        ep for ep in metadata.entry_points(group="console_scripts") if ep.name == "vllm-ir"
    ]
    assert script.value == "vllm_ir_cli:main"


def test_one_list_of_passes_for_the_front_end_and_the_config() -> None:
    import vllm_ir as ir
    from vllm_ir_cli import flags

    assert ir.IrPassConfig().enabled() == [n for n, on in flags.BUILTIN_PASSES.items() if on]
    assert not hasattr(flags, "PASSES")


def test_importing_core_gives_no_numpy_warning_and_loads_no_sympy() -> None:
    """Also: ``import vllm_ir`` leaves sympy (1.5 s, via torch's symbolic
    shapes) unloaded; every CLI command and subprocess pays for what it imports."""
    code = "import sys, vllm_ir; print('sympy loaded:', 'sympy' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "NumPy" not in result.stderr
    assert "sympy loaded: False" in result.stdout, result.stdout


DEMO_MODEL = ("--layers", "2", "--hidden", "32", "--tokens", "8")
"""The demo's model in every test that runs it: one set of kernels to compile."""


def _assert_the_demo_ran_eager_and_compiled(out: str) -> None:
    assert "fused_add_rms_norm: priority ['native'] -> native" in out
    assert "fused_add_rms_norm: priority ['native'] -> native (2 nodes)" in out
    assert "maybe_inplace calls functionalized: 2" in out
    assert "max |compiled - all-native|" in out
    assert "tokens/s, median of 2 passes after 5 warm-up:" in out
    assert re.search(r"eager +[\d,]+ \(p10-p90 [\d,]+-[\d,]+\)", out)
    assert re.search(r"compiled +[\d,]+ \(p10-p90 [\d,]+-[\d,]+\)", out)
    assert "threads: 1 (--threads;" in out


@pytest.mark.slow
def test_ops_and_demo_report_a_failed_provider_once_and_demo_runs_whole(tmp_path: Path) -> None:
    dist = tmp_path / "broken_provider-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-provider\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[vllm_ir.providers]\nbroken = no_such_module_xyz\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    for args in (
        ["ops"],
        # the model of the integration test's demo: its kernels come from Inductor's
        # cache, not a compile of their own
        ["demo", *DEMO_MODEL, "--runs", "2"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "vllm_ir_cli", *args], capture_output=True, text=True, env=env
        )
        assert result.returncode == 0, result.stderr
        both = result.stdout + result.stderr
        assert both.count("No module named 'no_such_module_xyz'") == 1, both
    # beside the failed provider the demo ran whole (one demo process, ~9 s, for both checks)
    _assert_the_demo_ran_eager_and_compiled(result.stdout)


def test_bench_times_impls_side_by_side(tmp_path: Path) -> None:
    out_file = tmp_path / "bench.json"
    result = vllm_ir(
        "bench",
        "rms_norm",
        "--shapes",
        "1x64 4x64",
        "--dtypes",
        "fp32",
        "--rounds",
        "3",
        "--warmup",
        "1",
        "--no-compiled",
        "--json",
        str(out_file),
    )
    assert "[2/2] 4x64 float32 native" in result.stderr  # progress
    assert "vs native eager: native eager's median over this impl's" in result.stdout
    data = json.loads(out_file.read_text())
    assert [r["shape"] for r in data["results"]] == [[1, 64], [4, 64]]
    assert all(r["median_us"] > 0 and r["rounds"] == 3 for r in data["results"])
    assert all(r["p10_us"] <= r["median_us"] <= r["p90_us"] for r in data["results"])
    assert data["threads"] == 1
    assert "threads: 1 (--threads;" in result.stdout
    assert "p10-p90 us" in result.stdout


def test_spread_and_noise() -> None:
    from vllm_ir._cli.bench import is_noisy, spread

    samples = [float(v) for v in range(1, 12)]  # 1 .. 11
    assert spread(samples) == (6.0, 2.0, 10.0)
    assert spread([5.0]) == (5.0, 5.0, 5.0)
    assert is_noisy(*spread(samples))
    assert not is_noisy(*spread([100.0, 101.0, 102.0, 103.0]))


def test_explain_lists_every_candidate() -> None:
    import torch
    import vllm_ir as ir
    from torch import Tensor
    from vllm_ir._cli.explain import candidate_lines

    op = ir.ops.rms_norm

    def impl(
        x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
    ) -> Tensor:
        return op.native(x, weight, epsilon, variance_size)

    def no_fp32(
        x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
    ) -> bool:
        return x.dtype != torch.float32

    op.register_impl("cli_picky", supports_args=no_fp32)(impl)
    op.register_impl("cli_late")(impl)
    op.register_impl("cli_unlisted", supports_args=no_fp32)(impl)
    try:
        call = (torch.ones(2, 8), None, 1e-6)
        with op.set_priority(["cli_picky", "native", "cli_late"]):
            lines = candidate_lines(op, call, "eager")
    finally:
        for name in ("cli_picky", "cli_late", "cli_unlisted"):
            op.unregister_impl(name)
    assert lines == [
        "cli_picky: rejected: arguments not supported (supports_args returned False)",
        "native: selected (first on the list that accepts)",
        "cli_late: not reached (would accept)",
        "cli_unlisted: not on the priority list (would be rejected: arguments not supported "
        "(supports_args returned False); --ir-op-priority.rms_norm=cli_unlisted puts it first)",
    ]
