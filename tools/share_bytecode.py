"""Give a new venv the bytecode its sibling venvs already compiled.

uv installs a wheel by hard-linking its files from uv's cache, so the venvs of
nox's sessions hold torch's sources as the same files, but Python writes each
module's bytecode into the venv's own ``__pycache__``: every session compiles
again the torch modules it imports (measured here: ``import torch,
torch._inductor.compile_fx, torch._dynamo`` 15.5 s in a new venv, 5.0 s once
its bytecode exists).

A ``.pyc`` compiled from the very file (same device and inode) in another venv
is valid in this one: importlib checks it against the source's mtime and size
and sets ``co_filename`` to the path it imported from. So this hard-links such
``.pyc`` files across, and nothing else: sources that are copies (pip,
virtualenv, the packages built per session) are different files and are left
to compile. A stale ``.pyc`` would fail importlib's check and be rewritten,
which replaces the link (an atomic rename), never writes into it.

    python tools/share_bytecode.py TARGET_VENV DONOR_VENV...
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path


def site_packages(venv: Path) -> Path | None:
    """The venv's ``site-packages`` (POSIX layout), or None if it has none."""
    found = sorted(venv.glob("lib/python*/site-packages"))
    return found[0] if found else None


def _same_file(a: str, b: str) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _link_folder(here: str, there: str) -> int:
    """Link ``here/__pycache__``'s files of sources ``there`` shares; how many."""
    linked = 0
    with os.scandir(os.path.join(here, "__pycache__")) as entries:
        for entry in entries:
            if not entry.name.endswith(".pyc"):  # importlib's temporaries end in a number
                continue
            link = os.path.join(there, "__pycache__", entry.name)
            module = entry.name.split(".", 1)[0]  # "mod.cpython-311.pyc"
            if os.path.exists(link) or not _same_file(
                os.path.join(here, f"{module}.py"), os.path.join(there, f"{module}.py")
            ):
                continue
            try:
                os.makedirs(os.path.dirname(link), exist_ok=True)
                os.link(entry.path, link)
            except OSError:  # another filesystem, a race with an import: it compiles
                continue
            linked += 1
    return linked


def share(target: Path, donors: Iterable[Path]) -> int:
    """Hard-link into ``target`` the donors' ``.pyc`` of sources it shares; how many."""
    into = site_packages(target)
    if into is None:
        return 0
    linked = 0
    for donor in donors:
        root = site_packages(donor)
        if root is None or donor.resolve() == target.resolve():
            continue
        for here, subdirs, _ in os.walk(root):
            there = os.path.join(into, os.path.relpath(here, root))
            # only folders the target has: the donor's other packages are not walked
            subdirs[:] = [
                d for d in subdirs if d == "__pycache__" or os.path.isdir(os.path.join(there, d))
            ]
            if "__pycache__" in subdirs:
                subdirs.remove("__pycache__")
                linked += _link_folder(here, there)
    return linked


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 1:
        print("usage: share_bytecode.py TARGET_VENV [DONOR_VENV...]", file=sys.stderr)
        return 2
    target, *donors = (Path(a) for a in args)
    print(f"{share(target, donors)} bytecode files linked from {len(donors)} venvs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
