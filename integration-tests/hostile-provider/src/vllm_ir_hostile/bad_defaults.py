"""Platform defaults given as a plain dict: refused by ``ProviderSpec`` itself."""

from __future__ import annotations

import vllm_ir as ir

provider = ir.provider.ProviderSpec(
    name="hostile_defaults",
    api_version=ir.provider.API_VERSION,
    register=lambda: None,
    defaults={"cpu": {"rms_norm": ["hostile_defaults"]}},  # type: ignore[arg-type]
)
