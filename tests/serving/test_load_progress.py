"""A model's load reports its progress: the callback sees the bytes of tensor data read so far rise to the file's
total, one call per tensor, and the `serving.model_loader` logger says when the load starts and when the model
is ready (time taken, resident size). The real SmolLM2 GGUF (slow), and two small safetensors shards.

    LINK_HOME=.link LINK_DATASETS_DIR=../shared/data .venv/bin/python -m pytest -q -m slow tests/serving/test_load_progress.py
"""

from __future__ import annotations

import logging
import re

import pytest

SMOLLM2_PARAMETERS = 134_515_008  # SmolLM2-135M's parameter count (Hugging Face model card: 135M, tied embeddings)


@pytest.mark.slow
def test_loading_smollm2_reports_rising_bytes_to_the_total_and_logs_start_and_ready(smollm2_gguf_path, caplog):
    from gguf import GGUFReader

    from serving.model_loader import load_model
    from serving.registry import default_registry

    tensors = GGUFReader(smollm2_gguf_path).tensors
    total = sum(int(t.n_bytes) for t in tensors)  # the file's tensor data as gguf's own reader sizes it
    calls: list[tuple[int, int]] = []
    with caplog.at_level(logging.INFO, logger="serving.model_loader"):
        loaded = load_model(default_registry().get("smollm2-135m-instruct"), "float32",
                            progress=lambda done, of: calls.append((done, of)))
    done = [d for d, _ in calls]
    assert len(calls) == len(tensors) and {of for _, of in calls} == {total}
    assert all(a < b for a, b in zip(done, done[1:])) and done[-1] == total
    # packed (the C++ GGUF module built): every tensor as the file stores it, the tied embedding once; float: float32
    resident = total if loaded.weights == "packed" else 4 * SMOLLM2_PARAMETERS
    assert loaded.resident_bytes == resident
    start, ready = [r.getMessage() for r in caplog.records if r.name == "serving.model_loader"]
    how = "packed GGUF blocks on the C++ module, float32 activations" if loaded.weights == "packed" else "float32"
    assert start == f"loading model smollm2-135m-instruct from {smollm2_gguf_path} ({total / 1e6:.1f} MB of weights, {how})"
    assert re.fullmatch(rf"model smollm2-135m-instruct is ready: loaded in \d+\.\d s, {resident / 1e6:.1f} "
                        r"MB resident", ready), ready


def test_safetensors_progress_counts_stored_bytes_and_ends_at_the_files_sizes(tmp_path):
    import torch
    from safetensors.torch import save_file

    from serving.loader.safetensors_loader import SafetensorsCheckpoint

    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.bfloat16)}, tmp_path / "1.safetensors")
    save_file({"c": torch.zeros(7, dtype=torch.float16)}, tmp_path / "2.safetensors")
    files = [tmp_path / "1.safetensors", tmp_path / "2.safetensors"]
    first, second = (f.stat().st_size for f in files)
    calls: list[tuple[int, int]] = []
    names = [name for name, _ in SafetensorsCheckpoint(tmp_path, None, files).tensors(lambda d, t: calls.append((d, t)))]
    assert names == ["a", "b", "c"]
    # a: 12 float32 = 48 bytes, b: 5 bfloat16 = 10; the first shard's end counts its header; c: 7 float16 = 14
    assert calls == [(48, first + second), (58, first + second), (first, first + second),
                     (first + 14, first + second), (first + second, first + second)]
