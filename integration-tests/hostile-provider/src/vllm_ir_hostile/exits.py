"""An import that calls ``sys.exit``, as an ``argparse`` at import time does."""

from __future__ import annotations

import sys

sys.exit("vllm-ir-hostile-provider: argparse rejected the host's sys.argv")
