"""``python -m vllm_ir_cli``: the ``vllm-ir`` command, without importing torch first."""

import sys

from vllm_ir_cli import main

sys.exit(main())
