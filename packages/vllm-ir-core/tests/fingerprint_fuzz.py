"""Random helper state an impl reaches, changed the ways a program changes between runs.

Each case builds a chain of layers from a root to a value the impl multiplies
by — objects (``__dict__``, ``__slots__``, a property, a method), dicts,
defaultdicts, lists, tuples, namespaces, closures, partials, tensors — rooted
in a module global or in the impl's closure, and generates the impl's source
that walks it. Then it changes one layer: the value it holds (what the impl
reads), a sibling the impl never reads, or the same value again.

The soundness rule (compile-v4 r05): when the impl's result changes, its
:func:`code_fingerprint` changes, or Inductor's FX cache would serve the graph
traced before the change. A change to nothing (the same value again) must
leave the fingerprint as it was, or the cache would never hit. The cross-process
half builds the same cases in a fresh interpreter, where the first change was
made before anything was fingerprinted, as a second run of a changed program.

    >>> case = Case.build(3)
    >>> before = case.fingerprint()
    >>> _ = case.change(random.Random(0))
    >>> case.result_changed() <= (case.fingerprint() != before)
    True
"""

from __future__ import annotations

import collections
import functools
import json
import random
import sys
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm_ir._base.fingerprint import code_fingerprint


class Box:
    def __init__(self, inner: Any, noise: Any) -> None:
        self.inner = inner
        self.noise = noise


class Slotted:
    __slots__ = ("inner", "noise")

    def __init__(self, inner: Any, noise: Any) -> None:
        self.inner = inner
        self.noise = noise


class Getter:
    def __init__(self, inner: Any, noise: Any) -> None:
        self._inner = inner
        self.noise = noise

    def get(self) -> Any:
        return self._inner


class Prop:
    def __init__(self, inner: Any, noise: Any) -> None:
        self._inner = inner
        self.noise = noise

    @property
    def value(self) -> Any:
        return self._inner


def _identity(v: Any) -> Any:
    return v


def _closure(inner: Any) -> Callable[[], Any]:
    return lambda: inner


@dataclass
class Layer:
    """How one layer holds the next: build it, read through it, set what it holds."""

    kind: str
    read: Callable[[str], str]
    make: Callable[[Any, Any], Any]
    set_inner: Callable[[Any, Any], None] | None
    set_noise: Callable[[Any, Any], None] | None


def _setattr(name: str) -> Callable[[Any, Any], None]:
    return lambda obj, v: setattr(obj, name, v)


def _setitem(key: Any) -> Callable[[Any, Any], None]:
    return lambda obj, v: obj.__setitem__(key, v)


def _set_cell(fn: Any, v: Any) -> None:
    fn.__closure__[0].cell_contents = v


LAYERS = [
    Layer("attr", lambda e: f"{e}.inner", Box, _setattr("inner"), _setattr("noise")),
    Layer("slots", lambda e: f"{e}.inner", Slotted, _setattr("inner"), _setattr("noise")),
    Layer("method", lambda e: f"{e}.get()", Getter, _setattr("_inner"), _setattr("noise")),
    Layer("property", lambda e: f"{e}.value", Prop, _setattr("_inner"), _setattr("noise")),
    Layer(
        "dict",
        lambda e: f"{e}['inner']",
        lambda i, n: {"inner": i, "noise": n},
        _setitem("inner"),
        _setitem("noise"),
    ),
    Layer(
        "defaultdict",
        lambda e: f"{e}['inner']",
        lambda i, n: collections.defaultdict(float, inner=i, noise=n),
        _setitem("inner"),
        _setitem("noise"),
    ),
    Layer("list", lambda e: f"{e}[1]", lambda i, n: [n, i], _setitem(1), _setitem(0)),
    Layer("tuple", lambda e: f"{e}[1]", lambda i, n: (n, i), None, None),
    Layer(
        "namespace",
        lambda e: f"{e}.inner",
        lambda i, n: types.SimpleNamespace(inner=i, noise=n),
        _setattr("inner"),
        _setattr("noise"),
    ),
    Layer("closure", lambda e: f"{e}()", lambda i, n: _closure(i), _set_cell, None),
    Layer("partial", lambda e: f"{e}()", lambda i, n: functools.partial(_identity, i), None, None),
]
BY_KIND = {layer.kind: layer for layer in LAYERS}


@dataclass
class Case:
    """One impl and the chain it reads; ``nodes[0]`` is the root."""

    seed: int
    kinds: list[str]
    tensor_leaf: bool
    in_closure: bool
    nodes: list[Any] = field(default_factory=list)
    module: types.ModuleType | None = None
    impl: Callable[[float], Any] | None = None
    baseline: list[float] = field(default_factory=list)

    @classmethod
    def build(cls, seed: int) -> Case:
        rng = random.Random(seed)
        kinds = [rng.choice(LAYERS).kind for _ in range(rng.randint(1, 4))]
        case = cls(seed, kinds, tensor_leaf=rng.random() < 0.3, in_closure=rng.random() < 0.4)
        leaf = case._leaf(rng.randint(1, 9))
        case.nodes = case._chain(leaf, rng)
        case._define()
        case.baseline = case.result()
        return case

    def _leaf(self, k: float) -> Any:
        return torch.tensor([float(k)]) if self.tensor_leaf else float(k)

    def _chain(self, leaf: Any, rng: random.Random) -> list[Any]:
        nodes = [leaf]
        for kind in reversed(self.kinds):
            nodes.insert(0, BY_KIND[kind].make(nodes[0], rng.randint(100, 200)))
        return nodes

    def _define(self) -> None:
        expr = "ROOT"
        for kind in self.kinds:
            expr = BY_KIND[kind].read(expr)
        read = f"float({expr}[0])" if self.tensor_leaf else expr
        name = f"fingerprint_fuzz_case_{self.seed}"
        module = types.ModuleType(name)
        sys.modules[name] = module
        if self.in_closure:
            source = (
                f"def make(ROOT):\n    def impl(x):\n        return x * {read}\n    return impl\n"
            )
            exec(source, module.__dict__)
            self.impl = module.make(self.nodes[0])
        else:
            module.ROOT = self.nodes[0]
            exec(f"def impl(x):\n    return x * {read}\n", module.__dict__)
            self.impl = module.impl
        self.module = module

    def result(self) -> list[float]:
        assert self.impl is not None
        return [float(self.impl(1.0))]

    def result_changed(self) -> bool:
        return self.result() != self.baseline

    def fingerprint(self) -> str | None:
        return code_fingerprint(self.impl)

    def change(self, rng: random.Random) -> str:
        """Change one layer at random; what was done, for the report."""
        depth = rng.randrange(len(self.kinds) + 1)  # len(kinds): the root binding itself
        what = rng.choice(["value", "noise", "same"])
        if depth == len(self.kinds):
            return self._rebind_root(what, rng)
        layer = BY_KIND[self.kinds[depth]]
        holder, held = self.nodes[depth], self.nodes[depth + 1]
        if what == "noise" and layer.set_noise is not None:
            layer.set_noise(holder, rng.randint(300, 400))
            return f"{layer.kind}: noise"
        if layer.set_inner is None:
            return f"{layer.kind}: immutable"
        if what == "same":
            layer.set_inner(holder, held)
            return f"{layer.kind}: same"
        if depth == len(self.kinds) - 1 and self.tensor_leaf and rng.random() < 0.5:
            held.add_(1.0)  # in place: the same tensor object, new values
            return f"{layer.kind}: tensor in place"
        fresh = self._chain(self._leaf(rng.randint(10, 19)), rng)[depth + 1 :]
        layer.set_inner(holder, fresh[0])
        self.nodes[depth + 1 :] = fresh
        return f"{layer.kind}: value"

    def _rebind_root(self, what: str, rng: random.Random) -> str:
        if self.in_closure:
            return "closure root: unchanged"
        assert self.module is not None
        if what == "value":
            self.nodes = self._chain(self._leaf(rng.randint(20, 29)), rng)
        self.module.ROOT = self.nodes[0]
        return f"global root: {what}"


def run_case(seed: int, steps: int, counts: Counter[str], failures: list[str]) -> None:
    """Apply ``steps`` random changes to case ``seed``, checking each against the rule.

    ``counts``: cases, changes, result_changes, fingerprint_changes and
    extra_changes (the fingerprint changed, the result did not: sound, a cache miss).
    """
    case = Case.build(seed)
    rng = random.Random(seed * 7919)
    counts["cases"] += 1
    for step in range(steps):
        before, was = case.fingerprint(), case.result()
        if before is None:
            failures.append(f"seed {seed} ({case.kinds}): cannot be fingerprinted")
            return
        done = case.change(rng)
        after, now = case.fingerprint(), case.result()
        counts["changes"] += 1
        counts["result_changes"] += now != was
        counts["fingerprint_changes"] += after != before
        counts["extra_changes"] += now == was and after != before
        if now != was and after == before:
            failures.append(
                f"seed {seed} step {step} ({case.kinds}, {done}): result {was} -> {now}, "
                "fingerprint unchanged (a stale graph would be served)"
            )
        if done.endswith(": same") and after != before:
            failures.append(f"seed {seed} step {step} ({case.kinds}): no change moved the key")


def second_run(seeds: list[int]) -> dict[int, dict[str, Any]]:
    """Per seed, as a second process would see it: the fingerprint and result of the
    case as built, and after its first change made before anything was hashed."""
    found: dict[int, dict[str, Any]] = {}
    for seed in seeds:
        built = Case.build(seed)
        changed = Case.build(seed)
        changed.change(random.Random(seed * 7919))
        found[seed] = {
            "built": built.fingerprint(),
            "changed": changed.fingerprint(),
            "result": changed.result(),
        }
    return found


if __name__ == "__main__":  # the classes must come from the module, not __main__
    from fingerprint_fuzz import second_run as run_here

    print(json.dumps(run_here([int(s) for s in sys.argv[1:]])))
