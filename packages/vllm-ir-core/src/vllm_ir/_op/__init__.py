"""The op layer: :class:`~vllm_ir._op.op.IrOp` (declaration, registration,
the call) and the call-site record the kernel plan reads."""
