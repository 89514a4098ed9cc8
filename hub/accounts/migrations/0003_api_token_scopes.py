"""API tokens get scopes (issue 14 item 8).

Tokens made before scopes existed get ``read`` and ``leases``: the scripts that use them keep
renting, reading and stopping leases, but a token that has leaked no longer mints a successor
that outlives its revocation. A renter who manages tokens from a script creates a new token with
``tokens`` on purpose; the dashboard session can always manage them.
"""

import django.contrib.postgres.fields
from django.db import migrations, models

import hub.accounts.models


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0002_api_token"),
    ]

    operations = [
        # AddField writes the default into every existing row: ["read", "leases"].
        migrations.AddField(
            model_name="apitoken",
            name="scopes",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.CharField(
                    choices=[
                        ("read", "read: see offers, templates, your leases and account"),
                        ("leases", "leases: start and stop leases, get their access tokens"),
                        ("tokens", "tokens: list, create and revoke API tokens"),
                    ],
                    max_length=16,
                ),
                default=hub.accounts.models.default_api_scopes,
                size=None,
            ),
        ),
        migrations.AddConstraint(
            model_name="apitoken",
            constraint=models.CheckConstraint(
                condition=models.Q(("scopes__contained_by", ["read", "leases", "tokens"])),
                name="api_token_scopes_known",
            ),
        ),
    ]
