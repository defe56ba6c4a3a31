"""Compute kernels behind one dispatch point.

The model code in `serving.models` never calls a kernel directly: it calls `dispatch(op, ...)`, which
looks the operation up in the dispatch table. The table holds the PyTorch references (`kernels.ref`)
and, where one exists, a faster CPU variant with the same contract (`kernels.cpu`); tuned variants
(Triton, `torch.compile`, quantized matmuls) are registered over them with `register()` without
touching the model code, or installed per shape bucket by the tuner (`kernels.tuner`), which learns
the hot buckets from the `ShapeRecorder` (`kernels.recorder`) and keeps its winners in a persistent
table (`kernels.winners`).
"""

from kernels.dispatch import (apply_pending, attach_recorder, dispatch, install, installed, recorder, register, registered,
                              reset, step_variant, use_references)
from kernels.recorder import Bucket, ShapeRecorder

__all__ = ["Bucket", "ShapeRecorder", "apply_pending", "attach_recorder", "dispatch", "install", "installed", "recorder",
           "register", "registered", "reset", "step_variant", "use_references"]
