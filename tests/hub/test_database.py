from __future__ import annotations

import pytest
from django.db import connection


@pytest.mark.django_db
def test_database_in_use_is_postgresql() -> None:
    assert connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        (version,) = cursor.fetchone()
    assert version.startswith("PostgreSQL ")
