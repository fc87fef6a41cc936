"""Check the metadata of every built wheel: the contract between our packages.

* every wheel ships ``py.typed`` and a version;
* core depends on torch through a range, never a pin;
* providers depend on ``vllm-ir-core`` through a compatible range
  (``>=X.Y,<X+1``), never on another provider, and declare a
  ``vllm_ir.providers`` entry point;
* integrations (``vllm-ir-transformers``, ``vllm-ir-vllm``) depend on core the
  same way and on no provider, and declare no provider entry point: they use
  whichever providers are installed; the vLLM plugin declares its
  ``vllm.general_plugins`` entry point and never depends on vllm (installing
  it must not pull or replace vLLM and its torch).

    python tools/check_wheels.py DIST_DIR
"""

from __future__ import annotations

import re
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

CORE = "vllm-ir-core"
INTEGRATIONS = frozenset({"vllm-ir-transformers", "vllm-ir-vllm"})
VLLM_PLUGIN = "vllm-ir-vllm"


def _metadata(wheel: zipfile.ZipFile) -> tuple[dict[str, list[str]], str]:
    meta_name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    message = Parser().parsestr(wheel.read(meta_name).decode())
    fields: dict[str, list[str]] = {}
    for key, value in message.items():
        fields.setdefault(key, []).append(value)
    eps_name = meta_name.replace("METADATA", "entry_points.txt")
    eps = wheel.read(eps_name).decode() if eps_name in wheel.namelist() else ""
    return fields, eps


def check(path: Path) -> list[str]:
    problems = []
    with zipfile.ZipFile(path) as wheel:
        fields, eps = _metadata(wheel)
        names = wheel.namelist()
    name = fields["Name"][0]
    requires = fields.get("Requires-Dist", [])
    runtime = [r for r in requires if "extra ==" not in r]
    if not any(n.endswith("/py.typed") for n in names):
        problems.append(f"{name}: no py.typed")
    if name == CORE:
        torch_req = [r for r in runtime if re.match(r"torch\b", r)]
        if not torch_req or "==" in torch_req[0]:
            problems.append(f"{name}: torch must be required as a range, got {torch_req}")
        return problems
    core_req = [r for r in runtime if r.startswith(CORE)]
    if not core_req or not re.search(r">=\d+\.\d+", core_req[0]) or "<" not in core_req[0]:
        problems.append(f"{name}: needs a compatible range on {CORE}, got {core_req}")
    others = [r for r in runtime if r.startswith("vllm-ir-") and not r.startswith(CORE)]
    if others:
        problems.append(f"{name}: providers must not depend on each other: {others}")
    if name in INTEGRATIONS:
        if "[vllm_ir.providers]" in eps:
            problems.append(f"{name}: an integration must not register a provider")
        if name == VLLM_PLUGIN:
            if "[vllm.general_plugins]" not in eps:
                problems.append(f"{name}: no vllm.general_plugins entry point")
            if any(re.match(r"vllm\b(?!-ir)", r) for r in runtime):
                problems.append(f"{name}: must not depend on vllm, got {runtime}")
    elif "[vllm_ir.providers]" not in eps:
        problems.append(f"{name}: no vllm_ir.providers entry point")
    return problems


def main(dist: str) -> int:
    wheels = sorted(Path(dist).glob("*.whl"))
    if not wheels:
        print(f"no wheels in {dist}", file=sys.stderr)
        return 1
    problems = [p for w in wheels for p in check(w)]
    for w in wheels:
        print(f"checked {w.name}")
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
