"""``python -m vllm_ir`` runs the ``vllm-ir`` command."""

import sys

from vllm_ir_cli import main

sys.exit(main())
