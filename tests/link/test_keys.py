"""link.keys on SQLite and PostgreSQL (the `link keys` commands: tests/cli/test_cli_keys.py).

    LINK_HOME=.link .venv/bin/python -m pytest -q tests/link/test_keys.py
"""

from __future__ import annotations

import hashlib

import pytest
from pydantic import SecretStr, ValidationError

from link.db.models import ApiKey
from link.keys import (KEY_PREFIX, MASTER_IDENTITY, KeyNotFound, create_key, get_key, list_keys, revoke_key,
                       verify_key)

MASTER = "sk-master-0123456789abcdef"


def test_create_stores_only_the_hash(session):
    key, plaintext = create_key(session, "alice", budget_usd=2.5, rpm_limit=60, tpm_limit=10_000)
    assert plaintext.startswith(KEY_PREFIX) and len(plaintext) >= len(KEY_PREFIX) + 40
    assert key.budget_usd == 2.5 and key.spend_usd == 0 and key.rpm_limit == 60 and key.tpm_limit == 10_000
    assert plaintext.startswith(key.key_prefix) and len(key.key_prefix) < len(plaintext) // 2
    row = session.get(ApiKey, key.id)
    assert row.key_hash == hashlib.sha256(plaintext.encode()).hexdigest()
    assert plaintext not in " ".join(str(value) for value in row.model_dump().values())
    assert "key_hash" not in key.model_dump()


def test_keys_are_unique(session):
    plaintexts = {create_key(session, "many")[1] for _ in range(5)}
    assert len(plaintexts) == 5


def test_verify(session):
    key, plaintext = create_key(session, "bob", budget_usd=1.0, rpm_limit=5)
    identity = verify_key(session, plaintext, master_key=MASTER)
    assert identity.key_id == key.id and identity.name == "bob" and identity.rpm_limit == 5
    assert identity.budget_usd == 1.0 and identity.has_budget and not identity.is_master
    assert verify_key(session, plaintext[:-1] + ("A" if plaintext[-1] != "A" else "B"), master_key=MASTER) is None
    assert verify_key(session, "not-a-key", master_key=MASTER) is None
    assert verify_key(session, "", master_key=MASTER) is None


def test_master_key_always_authenticates(session):
    assert verify_key(session, MASTER, master_key=MASTER) is MASTER_IDENTITY
    assert verify_key(session, MASTER, master_key=SecretStr(MASTER)).is_master
    assert verify_key(session, MASTER, master_key=None) is None
    assert verify_key(session, "", master_key="") is None


def test_revoke(session):
    key, plaintext = create_key(session, "carol")
    revoked = revoke_key(session, key.id)
    assert revoked.is_revoked and revoked.revoked_at.tzinfo is not None
    assert verify_key(session, plaintext) is None
    assert revoke_key(session, key.id).revoked_at == revoked.revoked_at  # idempotent
    with pytest.raises(KeyNotFound):
        revoke_key(session, 10**9)
    with pytest.raises(KeyNotFound):
        get_key(session, 10**9)


def test_list_keys(session):
    active, _ = create_key(session, "list-active")
    gone, _ = create_key(session, "list-revoked")
    revoke_key(session, gone.id)
    all_ids = [k.id for k in list_keys(session)]
    assert active.id in all_ids and gone.id in all_ids and all_ids == sorted(all_ids)
    active_ids = [k.id for k in list_keys(session, include_revoked=False)]
    assert active.id in active_ids and gone.id not in active_ids


@pytest.mark.parametrize("kwargs", [{"name": ""}, {"name": "x", "budget_usd": -1.0}, {"name": "x", "rpm_limit": 0}])
def test_create_rejects_invalid_fields(session, kwargs):
    with pytest.raises(ValidationError):
        create_key(session, **kwargs)
