"""Tokens made before scopes existed keep working for reading and renting, but cannot mint."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from hub.accounts.api_tokens import authenticate_api_token
from hub.lib import tokens

BEFORE = [("accounts", "0002_api_token")]
AFTER = [("accounts", "0003_api_token_scopes")]


@pytest.fixture
def before_scopes() -> Iterator[MigrationExecutor]:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        yield executor
    finally:
        # Whatever happened, the next tests find the schema the code expects.
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


# Migrations need their own transactions (ALTER TABLE after an insert in one transaction fails
# on pending deferred FK checks), so this test commits and is flushed afterwards.
@pytest.mark.django_db(transaction=True)
def test_existing_tokens_get_read_and_leases_but_not_tokens(
    before_scopes: MigrationExecutor,
) -> None:
    apps = before_scopes.loader.project_state(BEFORE).apps
    user = apps.get_model("accounts", "User").objects.create(username="old-script")
    plaintext = tokens.generate_token("cgpr_")
    apps.get_model("accounts", "ApiToken").objects.create(
        user=user, name="old", prefix=plaintext[:11], digest=tokens.digest(plaintext)
    )

    MigrationExecutor(connection).migrate(AFTER)

    token = authenticate_api_token(plaintext)
    assert token is not None
    assert token.scopes == ["read", "leases"]
