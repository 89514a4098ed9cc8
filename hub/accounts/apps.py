from __future__ import annotations

from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "hub.accounts"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from hub.lib import db_pool

        # The pool's check before lending a connection, in every hub process (hub/lib/db_pool.py).
        connection_created.connect(db_pool.use_on_pool_of, dispatch_uid="hub-db-pool-check")
