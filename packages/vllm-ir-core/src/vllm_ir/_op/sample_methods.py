"""One op's sample inputs: its own generator and the providers' extra samples.

The conformance kit, tests and benchmarks call an op on these; a provider
adds samples for the shapes its kernel special-cases, checked on its impl only.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping

import torch

from vllm_ir._base.registration import RegistrationHandle, record
from vllm_ir._schema.samples import SampleInput, SampleInputGenerator
from vllm_ir._schema.tolerances import Tolerance, ToleranceTable, tolerance_for

__all__ = ["OpSamples", "SampleMethods"]


class OpSamples:
    """The sample inputs of op ``name``; registrations record their handles."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.generator: SampleInputGenerator | None = None
        # provider -> its extra conformance samples, on top of the op's own
        self._extra: dict[str, list[SampleInputGenerator]] = {}

    def register_generator(self, generator: SampleInputGenerator) -> SampleInputGenerator:
        previous, self.generator = self.generator, generator

        def undo() -> None:
            if self.generator is generator:
                self.generator = previous

        record(RegistrationHandle(f"input generator of op {self.name!r}", undo))
        return generator

    def register_extra(
        self, provider: str
    ) -> Callable[[SampleInputGenerator], SampleInputGenerator]:
        if not isinstance(provider, str) or not provider:
            raise TypeError(
                f"register_extra_samples of op {self.name!r} takes a provider name, e.g. "
                f"@ir.ops.{self.name}.register_extra_samples('my_kernels'), got {provider!r}"
            )

        def decorator(generator: SampleInputGenerator) -> SampleInputGenerator:
            if not callable(generator):
                raise TypeError(
                    f"extra samples of op {self.name!r} for {provider!r} must be a generator "
                    f"function (dtype, device) -> SampleInputs, got {type(generator).__name__}"
                )
            extras = self._extra.setdefault(provider, [])
            extras.append(generator)

            def undo() -> None:
                if generator in extras:
                    extras.remove(generator)
                if not extras and self._extra.get(provider) is extras:
                    del self._extra[provider]

            record(RegistrationHandle(f"extra samples of op {self.name!r} for {provider!r}", undo))
            return generator

        return decorator

    def inputs(
        self, dtype: torch.dtype, device: torch.device | str, provider: str | None
    ) -> Iterator[SampleInput]:
        if self.generator is None:
            raise LookupError(
                f"op {self.name!r} has no input generator; register one with "
                f"@ir.ops.{self.name}.register_input_generator"
            )
        own = self.generator(dtype, torch.device(device))
        extras = list(self._extra.get(provider, ())) if provider is not None else []
        if not extras:
            return own
        return itertools.chain(own, *(g(dtype, torch.device(device)) for g in extras))


class SampleMethods:
    """What an op is checked on and against: its samples and tolerances (methods of
    :class:`~vllm_ir.IrOp`)."""

    name: str
    tolerances: ToleranceTable
    _samples: OpSamples

    @property
    def has_input_generator(self) -> bool:
        """Whether :meth:`input_generator` registered a generator of benchmark inputs."""
        return self._samples.generator is not None

    def register_input_generator(self, generator: SampleInputGenerator) -> SampleInputGenerator:
        """Decorator: the op's sample inputs, used by tests and benchmarks."""
        return self._samples.register_generator(generator)

    def register_extra_samples(
        self, provider: str
    ) -> Callable[[SampleInputGenerator], SampleInputGenerator]:
        """Decorator: more sample inputs for ``provider``'s impl of this op only.

        The conformance kit checks ``provider``'s impl on the op's own samples
        and then on these (the shapes its kernel special-cases, say); other
        providers' checks, and what :meth:`sample_inputs` yields without
        ``provider``, are unchanged. Undone with the provider's registrations.
        """
        return self._samples.register_extra(provider)

    def sample_inputs(
        self,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        *,
        provider: str | None = None,
    ) -> Iterator[SampleInput]:
        """The op's sample calls; with ``provider``, followed by that provider's
        extra samples (:meth:`register_extra_samples`)."""
        return self._samples.inputs(dtype, device, provider)

    def tolerance(self, dtype: torch.dtype) -> Tolerance:
        """How close an impl's result for ``dtype`` must be to native's (tests, the kit)."""
        return tolerance_for(dtype, self.tolerances)

    def register_tolerances(
        self, tolerances: Mapping[torch.dtype, Tolerance]
    ) -> RegistrationHandle:
        """Compare impls of this op with native within ``tolerances`` (dtype -> tolerance).

        Returns a handle; a failed provider load removes what it registered.

        >>> import torch, vllm_ir as ir
        >>> handle = ir.ops.silu_and_mul.register_tolerances(
        ...     {torch.float64: ir.Tolerance(atol=1e-12, rtol=1e-12)})
        >>> ir.ops.silu_and_mul.tolerance(torch.float64).atol
        1e-12
        >>> handle.remove()
        """
        return self.tolerances.register(tolerances)
