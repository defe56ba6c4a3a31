"""Compute kernels behind one dispatch point.

The model code in `serving.models` never calls a kernel directly: it calls `kernels.ops.<op>`, which
looks the operation up in the dispatch table. Today the table holds the PyTorch references
(`kernels.ref`); tuned variants (Triton, `torch.compile`, quantized matmuls) are registered over them
with `register()` without touching the model code.
"""

from kernels.dispatch import dispatch, register, registered, reset

__all__ = ["dispatch", "register", "registered", "reset"]
