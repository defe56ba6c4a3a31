"""Models registered in the gateway database (table `model`, `ModelRow`) besides those of link.yaml.

    register_local_model("sqlite:////home/me/.link/link.db", "acme-tools", Path("models/acme-tools"))
    config = with_registered_models(config, db_engine)    # open_gateway does this: `link serve` serves them

A registered local model is a safetensors checkpoint folder (a fine-tune exported by posttrain.export) served by
our engine; its row's `config` holds the `ModelDeployment` fields besides name and kind ({"local": "<folder>",
"architecture": "llama", "chat_format": "template", ...}). A model of link.yaml with the same name wins over a row.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import ValidationError
from sqlalchemy import Engine
from sqlmodel import Session, select

from link.config import ConfigError, LinkConfig, ModelDeployment, parse_config
from link.db.models import ModelPublic, ModelRow

logger = logging.getLogger(__name__)


class ModelNameTaken(ValueError):
    """The name is already used by a registered model, a local registry model or a configured model."""


def register_local_model(database_url: str, name: str, folder: str | Path, *, chat_format: str = "template",
                         context_length: int | None = None, input_cost_per_million: float = 0.0,
                         output_cost_per_million: float = 0.0, tool_format: str | dict | None = None,
                         config: LinkConfig | None = None) -> ModelPublic:
    """Register a safetensors checkpoint folder as local model `name` in the database at `database_url`.

    Args:
        database_url: the gateway's database (Settings.database_url); migrated to the newest schema first.
        name: the public model name clients will send.
        folder: a folder with config.json and *.safetensors (posttrain.export.export_adapter writes one); stored
            as an absolute path.
        chat_format: "template" (the folder's chat template) or "in-context".
        context_length: tokens of prompt plus output (None = the model's own).
        input_cost_per_million, output_cost_per_million: USD per 1e6 tokens, for routing and accounting.
        tool_format: the tool-call harness format it was trained on, as link.yaml's `tool_format` (a registered
            name or a dict of `serving.tools.formats.ToolCallFormat` fields; None = the default JSON format).
        config: the gateway config whose model names are taken too (default: the embedded default).
    Returns:
        the new row.
    Raises:
        ModelNameTaken: `name` is a registered, local-registry or configured model name.
        serving.errors.ModelFileError, UnsupportedArchitectureError: the folder is not a checkpoint we can serve.
        ValueError: an invalid name or settings (the message names the field).
    """
    from link.db import make_db_engine, upgrade
    from serving.loader.safetensors_loader import open_safetensors
    from serving.registry import default_registry

    folder = Path(folder).expanduser().resolve()
    checkpoint = open_safetensors(folder)
    try:
        deployment = ModelDeployment(name=name, kind="local", local=str(folder), architecture=checkpoint.config.architecture,
                                     chat_format=chat_format, context_length=context_length,
                                     input_cost_per_million=input_cost_per_million,
                                     output_cost_per_million=output_cost_per_million, tool_format=tool_format)
    except ValidationError as exc:
        raise ValueError(f"cannot register {name!r}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    taken = set(default_registry().names()) | set((config or _embedded()).model_names)
    if name in taken:
        raise ModelNameTaken(f"model name {name!r} is already a local or configured model; choose another name")
    upgrade(database_url)
    engine = make_db_engine(database_url, pool_size=1)
    try:
        with Session(engine) as session:
            if session.exec(select(ModelRow).where(ModelRow.name == name)).first() is not None:
                raise ModelNameTaken(f"model name {name!r} is already registered in {_safe(database_url)}; choose "
                                     "another name")
            row = ModelRow(name=name, kind="local", config=deployment_config(deployment))
            session.add(row)
            session.commit()
            session.refresh(row)
            return ModelPublic.model_validate(row)
    finally:
        engine.dispose()


def deployment_config(deployment: ModelDeployment) -> dict:
    """A deployment's row config: its fields other than name, kind and the derived id, without unset ones."""
    return deployment.model_dump(exclude={"name", "kind", "deployment_id"}, exclude_none=True, exclude_defaults=True)


def registered_deployments(engine: Engine) -> list[ModelDeployment]:
    """The database's model rows as deployments, in registration order (an invalid row is skipped with a warning)."""
    with Session(engine) as session:
        rows = session.exec(select(ModelRow).order_by(ModelRow.id)).all()
    deployments = []
    for row in rows:
        try:
            deployments.append(ModelDeployment(name=row.name, kind=row.kind, **row.config))
        except (ValidationError, TypeError) as exc:
            logger.warning("registered model %r (row %s) is not served: %s", row.name, row.id, exc)
    return deployments


def with_registered_models(config: LinkConfig, engine: Engine) -> LinkConfig:
    """`config` plus the database's registered models whose names it does not define (warned about otherwise)."""
    data = config.model_dump(exclude={"models": {"__all__": {"deployment_id"}}})
    for deployment in registered_deployments(engine):
        if deployment.name in config.model_names:
            logger.warning("registered model %r is not served: the config defines a model of that name", deployment.name)
            continue
        candidate = {**data, "models": [*data["models"], deployment.model_dump(exclude={"deployment_id"})]}
        try:
            parse_config(candidate, "registered models")
        except ConfigError as exc:
            logger.warning("registered model %r is not served: %s", deployment.name, exc)
            continue
        data = candidate
    return config if len(data["models"]) == len(config.models) else parse_config(data, "config + registered models")


def _embedded() -> LinkConfig:
    from link.config import embedded_default

    return embedded_default()


def _safe(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
