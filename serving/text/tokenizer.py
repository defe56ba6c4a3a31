"""Tokenizer: a `tokenizers.Tokenizer` plus the special tokens generation needs.

GGUF files carry their vocabulary (`tokenizer.ggml.*`). The first load converts it with the
`transformers` GGUF converter into a `tokenizer.json`, cached under `$LINK_HOME/cache/tokenizers`
keyed by the file's path, size and modification time, so later loads take about a second (converting
Gemma 3's 262k-token vocabulary takes ~17 s on a 2-core CPU).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from serving.paths import cache_dir

# Tokens that end an assistant turn in common chat formats; any present in the vocabulary stops
# generation, in addition to the declared end-of-sequence token.
END_OF_TURN_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "<eos>", "</s>")


@dataclass
class Tokenizer:
    """Text <-> token ids for one model.

    Attributes:
        backend: the `tokenizers.Tokenizer` (its post-processor adds BOS where the model wants it).
        bos_token, eos_token: their strings (chat templates refer to them), or None.
        eos_token_ids: every id that ends generation (EOS and end-of-turn tokens).
        chat_template: the Jinja2 chat template shipped with the model, or None.
        source_dir: the folder holding tokenizer.json (and tokenizer_config.json).
    """

    backend: object
    bos_token: str | None
    eos_token: str | None
    eos_token_ids: tuple[int, ...]
    chat_template: str | None = None
    source_dir: Path | None = None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str:
        return self.backend.id_to_token(token_id) or ""

    @classmethod
    def from_folder(cls, folder: str | Path, chat_template: str | None = None, eos_token_id: int | None = None) -> "Tokenizer":
        """Load `tokenizer.json` (+ `tokenizer_config.json` when present) from a folder."""
        from tokenizers import Tokenizer as Backend

        folder = Path(folder)
        backend = Backend.from_file(str(folder / "tokenizer.json"))
        config = {}
        if (folder / "tokenizer_config.json").is_file():
            config = json.loads((folder / "tokenizer_config.json").read_text())
        bos, eos = _token_str(config.get("bos_token")), _token_str(config.get("eos_token"))
        eos_ids = {backend.token_to_id(t) for t in (eos, *END_OF_TURN_TOKENS) if t and backend.token_to_id(t) is not None}
        if eos_token_id is not None:
            eos_ids.add(eos_token_id)
        return cls(backend, bos, eos, tuple(sorted(eos_ids)), chat_template or config.get("chat_template"), folder)

    @classmethod
    def from_gguf(cls, path: str | Path, metadata: dict) -> "Tokenizer":
        """The tokenizer stored in a GGUF file, converted once and cached."""
        path = Path(path).resolve()
        stat = path.stat()
        key = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        folder = cache_dir("tokenizers") / key
        if not (folder / "tokenizer.json").is_file():
            _convert_gguf_tokenizer(path, folder)
        return cls.from_folder(folder, metadata.get("tokenizer.chat_template"), metadata.get("tokenizer.ggml.eos_token_id"))


def _token_str(token) -> str | None:
    if isinstance(token, dict):  # AddedToken serialised as a dict
        return token.get("content")
    return token


def _convert_gguf_tokenizer(path: Path, folder: Path) -> None:
    """Convert into a private temporary folder, then rename it into place.

    The rename is atomic, so a crash mid-conversion leaves no half-written entry; when several
    processes convert the same file at once, the first rename wins and the others discard theirs.
    """
    import os
    import shutil
    import uuid

    from transformers import AutoTokenizer

    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok.save_pretrained(str(tmp))
    try:
        tmp.rename(folder)
    except OSError:
        if not (folder / "tokenizer.json").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
