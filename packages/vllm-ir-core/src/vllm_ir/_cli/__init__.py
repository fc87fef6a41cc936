"""The ``vllm-ir`` commands (``ops``, ``explain``, ``plan``, ``bench``, ``demo``,
``tune``): one module each, run by :func:`vllm_ir._cli.main.run` once the
torch-free front end (:mod:`vllm_ir_cli`) has parsed the command line."""
