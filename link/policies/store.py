"""Where policy names resolve: model names (implicit fixed), the config file's policies, the database.

    store = PolicyStore(engine, config)
    policy = await store.resolve("cheap-first")       # None when no such model or policy
    created = store.create(session, PolicyCreate(name="cheap-first", type="fallback", models=["a", "b"]))

Database policies are created, read, updated and deleted over `/api/policies`; config policies are
read-only there (edit link.yaml). Every gateway sharing the database sees a change within `ttl_s`
seconds (the store re-reads the table at most that often; this process's own changes apply at once).
The CRUD methods block on the database: call them through `asyncio.to_thread` from async code.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from link.config import LinkConfig, PolicyConfig
from link.db.models import PolicyCreate, PolicyPublic, PolicyRow, PolicyUpdate, utcnow
from link.policies.base import Policy, PolicyError, make_policy, policy_class
from link.policies.fixed import implicit_fixed

logger = logging.getLogger(__name__)


class PolicyNotFound(LookupError):
    """No database policy with this name."""


class PolicyConflict(ValueError):
    """The name is taken (by a model, a config policy or another database policy), or is read-only."""


def _policy_error(exc: ValidationError) -> PolicyError:
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first.get("loc", ())) or None
    return PolicyError(f"{param or 'policy'}: {first.get('msg', 'invalid').removeprefix('Value error, ')}", param=param)


def _named(policy: PolicyConfig, build):
    """`build()`, with a PolicyError's message prefixed by the config policy's name."""
    try:
        return build()
    except PolicyError as exc:
        raise PolicyError(f"policy {policy.name!r}: {exc.message}", param=exc.param) from None


def check_config_policies(config: LinkConfig) -> None:
    """Check the config's policies against its models without building them (no router or encoder is loaded):
    `link serve` runs it, on the config plus the database's registered models, before the server starts, so a
    bad policy is one line of error rather than a traceback from the server's start-up.

    Raises:
        PolicyError: a policy is invalid; the message names the policy and the field.
    """
    model_names = tuple(config.model_names)
    for p in config.policies:
        _named(p, lambda: policy_class(p.type).check(p, model_names))


class PolicyStore:
    """Resolves names to `Policy` objects and manages the database policies.

    Args:
        engine: the gateway's database.
        config: the loaded config (its models and read-only policies).
        ttl_s: seconds between re-reads of the `policy` table by `resolve`.
    Raises:
        PolicyError: a config policy is invalid (e.g. a type that is not registered).
    """

    def __init__(self, engine: Engine, config: LinkConfig, *, ttl_s: float = 2.0):
        self.engine = engine
        self.model_names = tuple(config.model_names)
        self.ttl_s = ttl_s
        self.fixed = {name: implicit_fixed(name, self.model_names) for name in self.model_names}
        self.configured = {p.name: _named(p, lambda: make_policy(p, self.model_names)) for p in config.policies}
        self._stored: dict[str, Policy] = {}
        self.invalid: dict[str, str] = {}  # database policies not served: name -> why (see `reload`)
        self._loaded_at = float("-inf")

    # --- resolution (request path) ---------------------------------------------------------------

    async def resolve(self, name: str) -> Policy | None:
        """The policy `name` stands for: a model's implicit fixed policy, a config policy or a database one."""
        policy = self.fixed.get(name) or self.configured.get(name)
        if policy is not None:
            return policy
        if time.monotonic() - self._loaded_at > self.ttl_s:
            await asyncio.to_thread(self.reload)
        return self._stored.get(name)

    def is_served(self, name: str) -> bool:
        """True when `name` is a model, a config policy or a database policy as last loaded (no database read)."""
        return name in self.fixed or name in self.configured or name in self._stored

    def reload(self) -> None:
        """Re-read the database policies. A row that no longer validates (a model removed from the config since,
        options stored before today's checks) is not served: it is logged once and listed in `invalid`."""
        with Session(self.engine) as session:
            rows = session.exec(select(PolicyRow)).all()
        stored, invalid = {}, {}
        for row in rows:
            old = self._stored.get(row.name)
            if old is not None and (old.config.type, old.config.models, old.config.options) == (row.type, row.models, row.options):
                stored[row.name] = old  # unchanged: keep it (a router policy keeps its loaded router file)
                continue
            try:
                stored[row.name] = make_policy(PolicyConfig(name=row.name, type=row.type, models=row.models,
                                                            options=row.options), self.model_names)
            except (PolicyError, ValidationError, TypeError, ValueError) as exc:
                invalid[row.name] = exc.message if isinstance(exc, PolicyError) else str(exc)
                if self.invalid.get(row.name) != invalid[row.name]:
                    logger.warning("policy %r in the database is not served: %s", row.name, invalid[row.name])
        self._stored, self.invalid, self._loaded_at = stored, invalid, time.monotonic()

    def stored_policies(self) -> list[Policy]:
        return list(self._stored.values())

    # --- CRUD (management API) -----------------------------------------------------------------

    def _validated(self, name: str, type_: str, models: list[str], options: dict[str, Any]) -> PolicyConfig:
        # The type's own checks first (they name the field); then the config schema's.
        policy_class(type_).check(PolicyConfig.model_construct(name=name, type=type_, models=models, options=options),
                                  self.model_names)
        try:
            return PolicyConfig(name=name, type=type_, models=models, options=options)
        except ValidationError as exc:
            raise _policy_error(exc) from None

    def why_invalid(self, policy: PolicyPublic) -> str | None:
        """Why a stored policy is not served (it fails today's checks: options stored before they were checked, a
        model removed from the config), or None when it is valid."""
        try:
            self._validated(policy.name, policy.type, policy.models, policy.options)
        except (PolicyError, TypeError, ValueError) as exc:
            return exc.message if isinstance(exc, PolicyError) else str(exc)
        return None

    def _check_name(self, name: str) -> None:
        if name in self.fixed:
            raise PolicyConflict(f"{name!r} is a model name; choose another policy name")
        if name in self.configured:
            raise PolicyConflict(f"{name!r} is defined in the config file and is read-only here; edit link.yaml")

    def create(self, session: Session, body: PolicyCreate) -> PolicyPublic:
        """Store a new policy.

        Raises:
            PolicyError: invalid type, models or options (400).
            PolicyConflict: the name is taken (409).
        """
        self._check_name(body.name)
        config = self._validated(body.name, body.type, body.models, body.options)
        row = PolicyRow(name=config.name, type=config.type, models=config.models, options=config.options)
        session.add(row)
        try:
            session.commit()
        except IntegrityError:
            session.rollback()
            raise PolicyConflict(f"a policy named {body.name!r} already exists") from None
        session.refresh(row)
        self._stored[row.name] = make_policy(config, self.model_names)
        return PolicyPublic.model_validate(row)

    def _row(self, session: Session, name: str) -> PolicyRow:
        row = session.exec(select(PolicyRow).where(PolicyRow.name == name)).first()
        if row is None:
            if name in self.configured:
                raise PolicyConflict(f"{name!r} is not a database policy (it comes from the config); it is read-only here")
            if name in self.fixed:
                raise PolicyNotFound(f"no policy named {name!r}; model names are implicit fixed policies and cannot "
                                     "be changed or deleted")
            raise PolicyNotFound(f"no policy named {name!r}")
        return row

    def get(self, session: Session, name: str) -> PolicyPublic:
        """One database policy. Raises PolicyNotFound (also for a model name), PolicyConflict (a config policy)."""
        return PolicyPublic.model_validate(self._row(session, name))

    def list(self, session: Session) -> list[PolicyPublic]:
        """Every database policy, oldest first."""
        return [PolicyPublic.model_validate(r) for r in session.exec(select(PolicyRow).order_by(PolicyRow.id))]

    def update(self, session: Session, name: str, body: PolicyUpdate, *, replace: bool = False) -> PolicyPublic:
        """Change a database policy: the fields given (PATCH), or all of them (PUT, `replace=True`); a `name`
        field on `body` (when it has one) renames the policy.

        Raises:
            PolicyNotFound (404), PolicyConflict (409: a config policy, or a new name that is taken),
            PolicyError (400; PUT without `type` or `models`).
        """
        row = self._row(session, name)
        if replace:
            missing = [f for f in ("type", "models") if getattr(body, f) is None]
            if missing:
                raise PolicyError(f"PUT replaces the whole policy: {', '.join(missing)} required", param=missing[0])
        new_name = getattr(body, "name", None) or name
        if new_name != name:
            self._check_name(new_name)
        options = body.options if body.options is not None else ({} if replace else row.options)
        config = self._validated(new_name, body.type or row.type, body.models if body.models is not None else row.models, options)
        row.name, row.type, row.models, row.options = config.name, config.type, list(config.models), dict(config.options)
        row.updated_at = utcnow()
        session.add(row)
        try:
            session.commit()
        except IntegrityError:
            session.rollback()
            raise PolicyConflict(f"a policy named {new_name!r} already exists") from None
        session.refresh(row)
        self._stored.pop(name, None)
        self.invalid.pop(name, None)
        self._stored[row.name] = make_policy(config, self.model_names)
        return PolicyPublic.model_validate(row)

    def delete(self, session: Session, name: str) -> None:
        """Delete a database policy. Raises PolicyNotFound (404; also for a model name), PolicyConflict (409: a
        config policy, which is read-only)."""
        row = self._row(session, name)
        session.delete(row)
        session.commit()
        self._stored.pop(name, None)
        self.invalid.pop(name, None)
