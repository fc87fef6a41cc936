"""The model ``vllm-ir tune --model`` sweeps, and its example inputs per token count.

``--model`` is one of:

* a local Hugging Face model directory (or a name already in the local
  Hugging Face cache): loaded with ``AutoModelForCausalLM.from_pretrained``
  on the CPU in float32, in eval mode. Its inputs for ``tokens`` are random
  ``input_ids`` (fixed seed): ``(tokens, 1)`` — one decode step of ``tokens``
  sequences — at decode sizes (up to the first bucket bound), ``(1, tokens)``
  — one prefill — above, called with ``use_cache=False``;
* ``module:callable``: ``callable()`` (called with no arguments) returns
  ``(model, example_inputs)``, both callable, where ``example_inputs(tokens:
  int)`` returns the positional arguments of one step as a tuple, or its
  keyword arguments as a dict. The module is imported from ``sys.path`` (the
  current directory included). A callable that needs arguments, or returns
  anything else, is a :class:`UsageError` saying so.

Either way the model is kernelized when it is not yet, by the first installed
package that names a module in the entry-point group ``vllm_ir.kernelizers``
(:data:`KERNELIZERS`); the module has ``is_kernelized(model)`` and
``kernelize(model)``, whose report has ``replaced`` and ``by_op()``. A model
that already calls IR ops needs nothing more.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from vllm_ir._cli.args import UsageError

__all__ = ["KERNELIZERS", "ModelSource", "load_model"]

KERNELIZERS = "vllm_ir.kernelizers"
"""The entry-point group of the packages that turn a model's modules into IR ops."""


@dataclass
class ModelSource:
    """A model to sweep and how to build one step's inputs for a token count."""

    name: str
    model: Callable[..., Any]
    example_inputs: Callable[[int], Any]
    kernelized: str
    """What kernelize did (or why it did not run), for the report."""

    def call(self, tokens: int) -> Callable[[], Any]:
        """One step at ``tokens`` as a no-argument callable (inputs built once)."""
        inputs = self.example_inputs(tokens)
        model = self.model
        if isinstance(inputs, dict):
            return lambda: model(**inputs)
        if not isinstance(inputs, tuple):
            raise UsageError(
                f"--model {self.name}: example_inputs({tokens}) returned "
                f"{type(inputs).__name__}; it must return a tuple of arguments or a dict"
            )
        return lambda: model(*inputs)


def load_model(spec: str, decode_max: int) -> ModelSource:
    """The model named by ``--model spec`` (see the module doc)."""
    if ":" in spec and not Path(spec).exists():
        model, inputs = _from_callable(spec)
    else:
        model, inputs = _from_pretrained(spec, decode_max)
    return ModelSource(spec, model, inputs, _kernelize(spec, model))


def _from_callable(spec: str) -> tuple[Any, Callable[[int], Any]]:
    module_name, _, attr = spec.partition(":")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # like `python -m`: the current directory's modules
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UsageError(f"--model {spec}: cannot import {module_name!r} ({e})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UsageError(f"--model {spec}: {module_name} has no callable {attr!r}")
    try:  # a callable that needs arguments is not a factory (json:loads)
        inspect.signature(factory).bind()
    except TypeError as e:
        raise UsageError(
            f"--model {spec}: {attr} cannot be called with no arguments ({e}); name a "
            "factory that takes none and returns (model, example_inputs)"
        ) from None
    except ValueError:  # no signature to check (some builtins): the call decides
        pass
    made = factory()
    problem = _factory_result_problem(made)
    if problem:
        raise UsageError(
            f"--model {spec}: {attr}() must return (model, example_inputs), both callable, "
            f"with example_inputs(tokens) -> args tuple or kwargs dict; {problem}"
        )
    return made


def _factory_result_problem(made: Any) -> str | None:
    """What is wrong with a factory's result (``None``: a usable pair)."""
    if not (isinstance(made, tuple) and len(made) == 2):
        return f"got {type(made).__name__}"
    for what, value in zip(("model", "example_inputs"), made, strict=True):
        if not callable(value):
            return f"got {type(value).__name__} {value!r:.40} as {what}, which is not callable"
    return None


_GIVE = (
    "give a local Hugging Face model directory, a name already in the local "
    "Hugging Face cache (nothing is downloaded), or module:callable"
)


def _path_problem(spec: str) -> str | None:
    """What rules ``spec`` out before loading (None: let transformers try it).

    A Hugging Face name has at most one ``/`` and no leading ``.``, ``/`` or ``~``;
    anything else is a path, and a path must be a directory with a ``config.json``.
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            return "a directory without config.json, not a Hugging Face model directory"
        return None
    if path.exists():
        return "a file, not a model directory"
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1 or "\\" in spec:
        return "no such directory"
    return None


def _from_pretrained(spec: str, decode_max: int) -> tuple[Any, Callable[[int], Any]]:
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        raise UsageError(
            f"--model {spec}: loading a Hugging Face model needs transformers "
            "(pip install vllm-ir-transformers)"
        ) from None
    problem = _path_problem(spec)
    if problem is not None:
        raise UsageError(f"--model {spec}: {problem}; {_GIVE}")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            spec, dtype=torch.float32, local_files_only=True
        )
    except (OSError, ValueError) as e:
        if Path(spec).expanduser().is_dir():
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            where = f"a model directory that does not load: {first}"
        else:
            # transformers speaks of the hub and repo ids here; nothing is downloaded
            where = "neither a directory here nor a model name in the local Hugging Face cache"
        raise UsageError(f"--model {spec}: {where}; {_GIVE}") from None
    model = cast(Any, model).to("cpu").eval()
    vocab = int(getattr(model.config, "vocab_size", 0) or 2)

    def example_inputs(tokens: int) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(tokens)
        shape = (tokens, 1) if tokens <= decode_max else (1, tokens)
        ids = torch.randint(0, vocab, shape, generator=generator)
        return {"input_ids": ids, "use_cache": False}

    return model, example_inputs


def _kernelize(spec: str, model: Any) -> str:
    if not isinstance(model, torch.nn.Module):
        return "not a torch.nn.Module: run as given"
    kernelizer = _kernelizer()
    if kernelizer is None:
        return f"no package of the entry-point group {KERNELIZERS} is installed: run as given"
    if kernelizer.is_kernelized(model):
        return "already kernelized"
    report = kernelizer.kernelize(model)
    return f"kernelized: {len(report.replaced)} modules ({report.by_op()})"


def _kernelizer() -> Any:
    """The module the first ``vllm_ir.kernelizers`` entry point names (by name), or None."""
    from importlib import metadata

    for entry_point in sorted(metadata.entry_points(group=KERNELIZERS), key=lambda e: e.name):
        try:
            return entry_point.load()
        except ImportError:
            continue  # a broken install: the next one, or run as given
    return None
