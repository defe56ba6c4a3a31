"""Which local model a name or path means, for training and scoring, checked before anything is loaded.

    spec = local_model_spec("smollm2-135m-instruct")    # a name of serving.registry.default_registry()
    spec = local_model_spec("models/acme-tools")         # a safetensors folder (posttrain.export writes one)
    spec = local_model_spec("models/tiny.gguf")          # a GGUF file
    spec = local_model_spec("acme-tools")                # a name registered in the gateway database (`link posttrain export`)
    llm = serving.LLM(spec.name, registry=ModelRegistry([spec]))

Only the folder's config.json or the GGUF header is read (no weights), so a model that is not local (a provider
model such as "openai/gpt-4o", a typo) fails in milliseconds, before any data is tokenized or any model loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posttrain.errors import ModelNotLocalError


def local_model_spec(model: str | Path, registry: Any = None, database_url: str | None = None):
    """The `serving.registry.ModelSpec` of a local model.

    Args:
        model: a local registry name (`link models`), a Hugging Face safetensors folder (config.json and
            *.safetensors, with the tokenizer files; chat format "template"), or a .gguf file.
        registry: a `serving.registry.ModelRegistry` (default: `default_registry()`).
        database_url: the gateway database whose registered local models (`link posttrain export`) are looked up
            by name after the registry (default: LINK_DATABASE_URL / $LINK_HOME/link.db; one that does not exist
            yet holds none).
    Returns:
        the registry's spec, or a new one named by the path as given, its architecture and context length read
        from the folder's config.json or the GGUF metadata.
    Raises:
        ModelNotLocalError: none of the three (the message lists the local names), or a folder / file that is
            not a model our engine runs (the loader's reason).
    """
    from serving.errors import ServingError
    from serving.registry import ModelSpec, default_registry

    registry = registry or default_registry()
    name = str(model)
    if name in registry:
        spec = registry.get(name)
        try:
            spec.resolve_path()
        except ServingError as exc:
            raise ModelNotLocalError(f"local model {name!r} is registered but its file is missing: {exc}") from None
        return spec
    path = Path(registered_folder(name, database_url) or name).expanduser()
    try:
        if path.is_dir():
            from serving.loader.safetensors_loader import open_safetensors

            config = open_safetensors(path).config
        elif path.is_file() and path.suffix == ".gguf":
            from serving.loader.gguf_loader import open_gguf

            config = open_gguf(path).config
        else:
            config = None
    except ServingError as exc:
        raise ModelNotLocalError(f"{path} is not a model the engine can run: {exc}") from None
    if config is None:
        provider = "/" in name and not path.exists()
        hint = (f"{name!r} looks like a provider model; post-training trains and scores local models only"
                if provider else f"{name!r} is not a local model name, a safetensors checkpoint folder or a .gguf file")
        raise ModelNotLocalError(f"model {name!r} is not local: {hint} (local models: {', '.join(registry.names())}; "
                                 "or pass a folder written by `link posttrain export`)")
    return ModelSpec(name=name, source=str(path), architecture=config.architecture, chat_format="template",
                     context_length=config.context_length, description=f"local checkpoint {path}")


def registered_folder(name: str, database_url: str | None = None) -> str | None:
    """The checkpoint folder of local model `name` registered in the gateway database, or None when the database
    does not exist, has no model table yet, or holds no local model of that name."""
    from sqlalchemy import inspect
    from sqlalchemy.exc import OperationalError

    from link.db import make_db_engine
    from link.model_registration import registered_deployments
    from link.settings import get_settings

    url = database_url or get_settings().database_url
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        return None  # do not create an empty database file by looking
    engine = make_db_engine(url, pool_size=1)
    try:
        if not inspect(engine).has_table("model"):
            return None
        found = [d for d in registered_deployments(engine) if d.name == name and d.kind == "local"]
    except OperationalError:  # an unreachable server: the name is then looked up as a path, with that error
        return None
    finally:
        engine.dispose()
    return found[0].local if found else None
