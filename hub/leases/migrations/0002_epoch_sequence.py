from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    """One global sequence for lease epochs: strictly growing per GPU whatever GPUs a lease
    holds, without a hot counter row."""

    dependencies = [("leases", "0001_initial")]

    operations = [
        migrations.RunSQL(
            "CREATE SEQUENCE IF NOT EXISTS leases_epoch_seq START 1",
            "DROP SEQUENCE IF EXISTS leases_epoch_seq",
        )
    ]
