"""IrOpPriorityConfig, KernelConfig and --ir-op-priority parsing."""

from __future__ import annotations

import random
import sys
import threading
from pathlib import Path

import pytest
import vllm_ir as ir
from torch import Tensor
from vllm_ir.priority import process_priorities, set_process_priority


@pytest.fixture
def with_kernel() -> ir.IrOp:
    op = ir.ops.rms_norm
    if "cfg_kernel" not in op.registered_impls:

        @op.register_impl("cfg_kernel")
        def cfg_kernel(
            x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
        ) -> Tensor:
            return op.native(x, weight, epsilon, variance_size)

    yield op
    op.unregister_impl("cfg_kernel")


def test_cli_dotted_form_repeatable(with_kernel: ir.IrOp) -> None:
    config, rest = ir.parse_ir_op_priority_args(
        [
            "serve",
            "--ir-op-priority.rms_norm=cfg_kernel,native",
            "--ir-op-priority.fused_add_rms_norm",
            "native",
            "--port=8000",
        ]
    )
    assert config.to_dict() == {
        "rms_norm": ["cfg_kernel", "native"],
        "fused_add_rms_norm": ["native"],
    }
    assert rest == ["serve", "--port=8000"]


def test_cli_json_form_and_later_flags_win(with_kernel: ir.IrOp) -> None:
    config = ir.IrOpPriorityConfig.from_cli_args(
        [
            '--ir-op-priority={"rms_norm": ["native"], "fused_add_rms_norm": ["native"]}',
            "--ir-op-priority.rms-norm=cfg_kernel",
        ]
    )
    assert config.to_dict() == {"rms_norm": ["cfg_kernel"], "fused_add_rms_norm": ["native"]}
    spaced = ir.IrOpPriorityConfig.from_cli_args(["--ir-op-priority", '{"rms_norm": ["native"]}'])
    assert spaced == ir.IrOpPriorityConfig(rms_norm=["native"])


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--ir-op-priority.rms_norm="], "comma-separated list of providers"),
        (["--ir-op-priority.rms_norm=a,,b"], "comma-separated list of providers"),
        (["--ir-op-priority.rms_norm"], "expects a value"),
        (["--ir-op-priority.=native"], "missing op name"),
        (["--ir-op-priority={not json"], "is not valid JSON"),
        (['--ir-op-priority=["native"]'], "must map op names to lists"),
        (['--ir-op-priority={"rms_norm": "native"}'], "must map op names to lists"),
        (["--ir-op-priority-x=native"], "unrecognized flag"),
        (["--ir-op-priority.no_such_op=native"], "unknown IR op 'no_such_op'; known ops:"),
        (["--ir-op-priority.rms_norm=nope"], r"unknown provider\(s\) 'nope'.*known providers:"),
    ],
)
def test_cli_rejects_malformed(argv: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ir.parse_ir_op_priority_args(argv)


def test_from_cli_args_rejects_other_arguments() -> None:
    with pytest.raises(ValueError, match="unrecognized arguments: --port"):
        ir.IrOpPriorityConfig.from_cli_args(["--port", "1"])


def test_config_scope_and_apply(with_kernel: ir.IrOp) -> None:
    config = ir.IrOpPriorityConfig(rms_norm=["cfg_kernel"])
    with config.scope():
        assert with_kernel.get_priority() == ["cfg_kernel", "native"]
    assert with_kernel.get_priority() == ["native"]
    config.apply()
    assert with_kernel.get_priority() == ["cfg_kernel", "native"]
    assert with_kernel.get_priority_entries()[0].source == "user (process-wide)"


def test_apply_returns_a_handle_that_restores_every_list(with_kernel: ir.IrOp) -> None:
    """A plugin takes its settings back without reading core's process-wide state."""
    ir.IrOpPriorityConfig(silu_and_mul=["native"]).apply()
    handle = ir.KernelConfig(ir_op_priority={"rms_norm": ["cfg_kernel"]}).apply(replace=True)
    assert with_kernel.get_priority() == ["cfg_kernel", "native"]
    assert ir.ops.silu_and_mul.get_priority_entries()[0].source != "user (process-wide)"
    handle.remove()
    assert with_kernel.get_priority() == ["native"]
    assert ir.ops.silu_and_mul.get_priority_entries()[0].source == "user (process-wide)"
    assert handle.removed
    handle.remove()  # once: a second remove changes nothing
    assert with_kernel.get_priority() == ["native"]


def test_handles_removed_out_of_order_take_back_their_own_setting() -> None:
    """Two plugins' handles, removed first-in-first-out (reliability-v4 03)."""
    a = ir.IrOpPriorityConfig(rms_norm=["native"]).apply()
    b = ir.KernelConfig(ir.IrOpPriorityConfig(silu_and_mul=["native"])).apply()
    a.remove()
    assert sorted(process_priorities()) == ["silu_and_mul"]
    b.remove()
    assert dict(process_priorities()) == {}


@pytest.mark.parametrize("seed", range(4))
def test_random_apply_and_remove_sequences_fold_the_live_settings(seed: int) -> None:
    """Random apply (with and without replace), handle removal in any order,
    set and clear: the lists in force are always the live settings folded in
    order, each over those before it or alone where it replaces them."""
    rng = random.Random(seed)
    ops = ["rms_norm", "silu_and_mul", "gelu_and_mul", "fused_add_rms_norm"]
    lists = (["native"],)
    live: list[tuple[object, dict[str, list[str]], bool]] = []  # (handle, lists, replace)
    for _ in range(300):
        action = rng.choice(("apply", "apply", "remove", "remove", "set", "clear"))
        chosen = {op: rng.choice(lists) for op in rng.sample(ops, rng.randint(0, 2))}
        replace = rng.random() < 0.2
        if action == "apply":
            handle = ir.IrOpPriorityConfig(**chosen).apply(replace=replace)
            live.append((handle, chosen, replace))
        elif action == "remove" and (held := [i for i, s in enumerate(live) if s[0]]):
            handle, _, _ = live.pop(rng.choice(held))
            handle.remove()  # type: ignore[attr-defined]
        elif action == "set":
            set_process_priority(chosen, replace=replace)
            live.append((None, chosen, replace))
        elif action == "clear":
            ir.clear_process_priority()
            live.clear()
        want: dict[str, tuple[str, ...]] = {}
        for _handle, settings, replaces in live:
            if replaces:
                want = {}
            want.update({op: tuple(p) for op, p in settings.items()})
        assert dict(process_priorities()) == want
    for handle, _, _ in live:
        if handle is not None:
            handle.remove()  # type: ignore[attr-defined]


def test_concurrent_applies_all_land() -> None:
    """Four threads apply one op each at once: none is lost (reliability-v4 04)."""
    names = ["rms_norm", "silu_and_mul", "gelu_and_mul", "fused_add_rms_norm"]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        for _ in range(50):
            ir.clear_process_priority()
            barrier = threading.Barrier(len(names))

            def go(op: str, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                ir.IrOpPriorityConfig(**{op: ["native"]}).apply()

            threads = [threading.Thread(target=go, args=(n,)) for n in names]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert sorted(process_priorities()) == sorted(names)
    finally:
        sys.setswitchinterval(interval)
        ir.clear_process_priority()


def test_kernel_config_accepts_dict_and_config(with_kernel: ir.IrOp) -> None:
    from_dict = ir.KernelConfig(ir_op_priority={"rms_norm": ["cfg_kernel", "native"]})
    from_obj = ir.KernelConfig(
        ir_op_priority=ir.IrOpPriorityConfig(rms_norm=["cfg_kernel", "native"])
    )
    assert from_dict.ir_op_priority == from_obj.ir_op_priority
    with from_dict.scope():
        assert with_kernel.get_priority()[0] == "cfg_kernel"
    assert ir.KernelConfig().ir_op_priority.to_dict() == {}
    with pytest.raises(TypeError, match="must map op names"):
        ir.KernelConfig(ir_op_priority=["native"])  # type: ignore[arg-type]


def test_merged_overrides_per_op(with_kernel: ir.IrOp) -> None:
    base = ir.IrOpPriorityConfig(rms_norm=["native"], fused_add_rms_norm=["native"])
    merged = base.merged(ir.IrOpPriorityConfig(rms_norm=["cfg_kernel"]))
    assert merged.to_dict() == {"rms_norm": ["cfg_kernel"], "fused_add_rms_norm": ["native"]}
    assert "rms_norm=['cfg_kernel']" in repr(merged)


# -- hostile input: one-line errors, bounded work, values cut short ------------


def test_deeply_nested_json_is_a_one_line_error_not_recursion() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ValueError, match="nests deeper than") as info:
        ir.parse_ir_op_priority_args(["--ir-op-priority", deep])
    assert "\n" not in str(info.value)
    assert len(str(info.value)) < 400


def test_huge_invalid_json_is_not_echoed_whole() -> None:
    with pytest.raises(ValueError, match="is not valid JSON") as info:
        ir.parse_ir_op_priority_args(["--ir-op-priority", "{" + "x" * 5_000_000])
    assert len(str(info.value)) < 400
    assert "(5000003 chars)" in str(info.value)


def test_json_naming_an_op_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="names op 'rms_norm' twice"):
        ir.parse_ir_op_priority_args(
            ["--ir-op-priority", '{"rms_norm": ["bogus"], "rms_norm": ["native"]}']
        )


def test_flag_value_is_not_taken_from_the_next_flag() -> None:
    with pytest.raises(ValueError, match="expects a value, got the next flag '--verbose'"):
        ir.parse_ir_op_priority_args(["--ir-op-priority.rms_norm", "--verbose"])


def test_non_string_keys_are_a_clear_error() -> None:
    with pytest.raises(TypeError, match="keys must be op names, got 1"):
        ir.IrOpPriorityConfig.from_dict({1: ["native"]})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="ir_passes must map IR pass names to bools"):
        ir.KernelConfig(ir_passes=["fuse_norm_quant"])  # type: ignore[arg-type]


def test_iterator_of_providers_is_read_once_not_emptied() -> None:
    config = ir.IrOpPriorityConfig(rms_norm=iter(["native"]))
    assert config.to_dict() == {"rms_norm": ["native"]}


# -- tune documents: the same checks and unwrapping for a file and its text ---------


def test_a_tune_document_naming_an_op_twice_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    path.write_text(
        '{"ir_op_priority": {"rms_norm": ["native"], "rms_norm": ["bogus"]}, "measured": {}}'
    )
    for load in (
        lambda: ir.IrOpPriorityConfig.from_json(path),
        lambda: ir.IrOpPriorityConfig.from_json(str(path)),
        lambda: ir.IrOpPriorityConfig.from_cli_args([f"--ir-op-priority=@{path}"]),
        lambda: ir.IrOpPriorityConfig.from_json(path.read_text()),
    ):
        with pytest.raises(ValueError, match="names op 'rms_norm' twice"):
            load()


def test_a_tune_document_loads_alike_from_its_file_and_its_text(tmp_path: Path) -> None:
    doc = '{"ir_op_priority": {"rms_norm": ["native"]}, "measured": {}, "dtype": "float32"}'
    path = tmp_path / "tuned.json"
    path.write_text(doc)
    from_file = ir.IrOpPriorityConfig.from_json(path)
    assert from_file.to_dict() == {"rms_norm": ["native"]}
    assert ir.IrOpPriorityConfig.from_json(doc).to_dict() == from_file.to_dict()
    assert ir.IrOpPriorityConfig.from_cli_args([f"--ir-op-priority={doc}"]).to_dict() == {
        "rms_norm": ["native"]
    }
    path.write_text('{"ir_op_priority": ["native"]}')
    with pytest.raises(ValueError, match=f"@{path}: its ir_op_priority: JSON must map"):
        ir.IrOpPriorityConfig.from_json(path)


def test_a_file_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "binary.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match="is not UTF-8") as info:
        ir.IrOpPriorityConfig.from_cli_args([f"--ir-op-priority=@{path}"])
    assert f"--ir-op-priority=@{path}" in str(info.value)
    assert "\n" not in str(info.value)


def test_an_endless_priority_file_is_refused_after_a_bounded_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm_ir import config

    monkeypatch.setattr(config, "MAX_PRIORITY_FILE_BYTES", 2**20)
    with pytest.raises(ValueError, match="@/dev/zero: the file is larger than 1 MiB") as info:
        ir.IrOpPriorityConfig.from_cli_args(["--ir-op-priority=@/dev/zero"])
    assert "\n" not in str(info.value)


def test_errors_quote_huge_or_deep_priorities_in_bounded_text() -> None:
    last = {"priority": ["native"]}
    many = [{"max_tokens": 16, "priority": [f"nope{i}" for i in range(20_000)]}, last]
    with pytest.raises(ValueError, match=r"'nope0', .* and 19992 more for op 'rms_norm'") as info:
        ir.IrOpPriorityConfig(rms_norm=many)
    assert len(str(info.value)) < 400
    flag = "--ir-op-priority.rms_norm=<=" + "9" * 5000 + ":native;native"
    with pytest.raises(ValueError, match=r"bucket bound '9+\.\.\. \(5002 chars\) is not an int"):
        ir.parse_ir_op_priority_args([flag])
    deep: list[object] = ["native"]
    for _ in range(20_000):
        deep = [deep]
    with pytest.raises(ValueError, match="must be") as info:  # no RecursionError
        ir.IrOpPriorityConfig(rms_norm=deep)
    assert len(str(info.value)) < 400
