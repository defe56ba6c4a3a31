"""`PackCache`: a weight tensor -> a packed form of it (int8/int4 blocks, a transposed copy, MKL's packing,
GGUF blocks), computed once per weight and freed with it.

    KN_PACKS = PackCache(lambda w: w.detach().t().contiguous())
    KN_PACKS.get(layer.weight)      # packed on first use, the same object after; repacked after an in-place change

Why a cache and not a prepare step: the dispatch contract passes the float weight on every call
(`dispatch("linear", x, self.qkv_proj)`), so a variant can serve any model with no change to the model.
Held through a weak reference to the weight (a freed weight frees its pack); a weight changed in place is
repacked (its autograd version counter moves; writes through `.data` are not seen). Each call must pass
the same tensor object (a parameter), not a fresh view of it, or every call packs again. Shared by the CPU
linears (`kernels.cpu_linear`), the quantized ones (`kernels.quant_cpu`) and the C++ step's
(`kernels.native_step`).
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable

import torch


def _version(weight: torch.Tensor) -> int:
    try:
        return weight._version
    except RuntimeError:  # inference tensors keep no version counter; they cannot be changed in place either
        return 0


class PackCache:
    """Weight tensor -> its packed form, computed once per weight and freed with it. Thread-safe.

    Args:
        pack: weight [N, K] -> packed form.
    """

    def __init__(self, pack: Callable[[torch.Tensor], object]):
        self._pack = pack
        self._lock = threading.RLock()  # reentrant: a weakref callback may run in the thread holding it
        self._entries: dict[int, tuple[weakref.ref, int, object]] = {}  # id(weight) -> (ref, version, pack)
        self.num_packs = 0  # how many times `pack` ran

    def get(self, weight: torch.Tensor):
        """The packed form of `weight`, packing it on first use (or after an in-place change)."""
        key = id(weight)
        entry = self._entries.get(key)  # lock-free fast path: a dict read is atomic
        if entry is not None and entry[0]() is weight and entry[1] == _version(weight):
            return entry[2]
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0]() is weight and entry[1] == _version(weight):
                return entry[2]
            packed = self._pack(weight)
            self._entries[key] = (weakref.ref(weight, self._releaser(key)), _version(weight), packed)
            self.num_packs += 1
            return packed

    def _releaser(self, key: int) -> Callable[[weakref.ref], None]:
        def release(ref: weakref.ref) -> None:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None and entry[0] is ref:  # not a newer weight that reused the id
                    del self._entries[key]

        return release

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every pack."""
        with self._lock:
            self._entries.clear()
