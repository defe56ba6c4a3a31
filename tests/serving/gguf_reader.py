"""`ArrayReader`: `gguf.GGUFReader` for tests that read the real GGUF files with the gguf package itself.

GGUFReader slices its `np.memmap` once per header value, so a vocabulary of 49k-262k strings is millions of
memmap slices, and numpy's bookkeeping on each (`memmap.__array_finalize__`) is most of the parse: SmolLM2's
header takes 2.0 s of CPU, Qwen2.5-Coder 0.5B's 9.8 s. `ArrayReader` slices a plain ndarray view of the same
memmap instead (0.7 s and 2.7 s): the same bytes, no copy of the file, the same fields and tensors.
"""

from __future__ import annotations

import numpy as np
from gguf import GGUFReader


class ArrayReader(GGUFReader):
    """A `GGUFReader` whose header and tensor slices come from an ndarray view of the file's memmap."""

    def _get(self, offset, dtype, count=1, override_order=None):
        if type(self.data) is np.memmap:  # the first read, from GGUFReader.__init__
            self.data = self.data.view(np.ndarray)  # still backed by the memmap: pages are read on demand
        return super()._get(offset, dtype, count, override_order)
