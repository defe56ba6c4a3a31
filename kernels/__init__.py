"""Compute kernels behind one dispatch point.

The model code in `serving.models` never calls a kernel directly: it calls `dispatch(op, ...)`, which
looks the operation up in the dispatch table. The table holds the PyTorch references (`kernels.ref`)
and, where one exists, a faster CPU variant with the same contract (`kernels.cpu`); tuned variants
(Triton, `torch.compile`, quantized matmuls) are registered over them with `register()` without
touching the model code.
"""

from kernels.dispatch import dispatch, register, registered, reset, use_references

__all__ = ["dispatch", "register", "registered", "reset", "use_references"]
