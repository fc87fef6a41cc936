"""vllm-ir-cpu: C++ CPU kernels for vllm-ir, provider ``cpu_c``.

Importing this package only builds :data:`provider`, a
:class:`vllm_ir.ProviderSpec`; vllm-ir calls its ``register`` on discovery,
which defines the kernel ops' schemas and registers the IR impls. The C++
library is compiled (or loaded from the cache) on the first real kernel call,
never at import or discovery; ``python -m vllm_ir_cpu build`` does it ahead of
time.

>>> import vllm_ir_cpu
>>> vllm_ir_cpu.provider.name
'cpu_c'
"""

from __future__ import annotations

from vllm_ir import PlatformDefaults, ProviderSpec

from vllm_ir_cpu._version import __version__

__all__ = ["PROVIDER", "__version__", "provider"]

PROVIDER = "cpu_c"
"""The provider name of every impl this package registers."""


def _register() -> None:
    # imported here so that discovering (or importing) the package stays cheap
    from vllm_ir_cpu.impls import register_impls

    register_impls()


provider = ProviderSpec(
    name=PROVIDER,
    api_version=1,  # the vllm-ir provider API this package is written against
    register=_register,
    defaults=(
        PlatformDefaults(
            "cpu",
            eager={"rms_norm": [PROVIDER], "fused_add_rms_norm": [PROVIDER]},
            # Measured (benchmarks/cpu_kernels.py, table "model"; README "Default
            # priorities"): a compiled graph with the native functions, which Inductor
            # fuses with their neighbours, ran in 0.24-0.66x the time of one calling
            # the opaque kernels, in place or not, at 1-1024 tokens.
            compiled={"rms_norm": ["native"], "fused_add_rms_norm": ["native"]},
        ),
    ),
)
"""The entry point ``cpu_c`` of the ``vllm_ir.providers`` group."""
