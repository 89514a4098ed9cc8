from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from hub.lib.env import EnvError, database_from_url, env_bool, env_int, env_secret
from tests.support.processes import REPO_ROOT, hub_env


def _without_secrets(**extra: str) -> dict[str, str]:
    env = hub_env(**extra)
    for name in ("SECRET_KEY", "SECRET_KEY_FILE", "DEBUG"):
        if name not in extra:
            env.pop(name, None)
    return env


def _manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_refuses_to_start_without_debug_on_default_secret_key() -> None:
    result = _manage(_without_secrets(), "check")
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr
    assert "ImproperlyConfigured" in result.stderr


def test_debug_tolerates_the_default_secret_key() -> None:
    result = _manage(_without_secrets(DEBUG="1"), "check")
    assert result.returncode == 0, result.stderr


def test_check_deploy_is_clean_under_production_like_settings(tmp_path: Path) -> None:
    key_file = tmp_path / "secret_key"
    key_file.write_text(secrets.token_urlsafe(50) + "\n")
    env = _without_secrets(
        SECRET_KEY_FILE=str(key_file),
        DEBUG="0",
        HUB_PUBLIC_URL="https://hub.example.com",
        ALLOWED_HOSTS="hub.example.com",
    )
    result = _manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_rejects_a_database_url_that_is_not_postgres() -> None:
    result = _manage(_without_secrets(DEBUG="1", DATABASE_URL="sqlite:///db.sqlite3"), "check")
    assert result.returncode != 0
    assert "PostgreSQL only" in result.stderr


def test_database_url_becomes_a_postgres_entry() -> None:
    entry = database_from_url("postgres://u%40x:p%2Fw@db.internal:6543/cloud?sslmode=require")
    assert entry["ENGINE"] == "django.db.backends.postgresql"
    assert (entry["USER"], entry["PASSWORD"]) == ("u@x", "p/w")
    assert (entry["HOST"], entry["PORT"], entry["NAME"]) == ("db.internal", "6543", "cloud")
    assert entry["OPTIONS"] == {"sslmode": "require"}


def test_database_url_without_a_name_is_refused() -> None:
    with pytest.raises(EnvError, match="names no database"):
        database_from_url("postgres://u@h:5432/")


def test_env_bool_refuses_a_typo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOME_FLAG", "ture")
    with pytest.raises(EnvError, match="SOME_FLAG"):
        env_bool("SOME_FLAG")


def test_env_int_refuses_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOME_NUMBER", "ten")
    with pytest.raises(EnvError, match="SOME_NUMBER"):
        env_int("SOME_NUMBER", 1)


def test_secrets_are_read_from_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("from-the-file\n")
    monkeypatch.delenv("MY_SECRET", raising=False)
    monkeypatch.setenv("MY_SECRET_FILE", str(secret))
    assert env_secret("MY_SECRET") == "from-the-file"


def test_an_unreadable_secret_file_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("MY_SECRET", raising=False)
    monkeypatch.setenv("MY_SECRET_FILE", str(tmp_path / "missing"))
    with pytest.raises(EnvError, match="MY_SECRET_FILE"):
        env_secret("MY_SECRET")


def _database_setting(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = (
        "from django.conf import settings; d = settings.DATABASES['default']; "
        "print(d['CONN_MAX_AGE'], d['CONN_HEALTH_CHECKS'], d['OPTIONS'].get('pool'))"
    )
    return _manage(env, "shell", "-c", code)


def test_connections_are_pooled_per_process_by_default() -> None:
    result = _database_setting(hub_env(DEBUG="1", DATABASE_POOL_MAX_SIZE="7"))
    assert result.returncode == 0, result.stderr
    conn_max_age, health_checks, pool = result.stdout.strip().splitlines()[-1].split(" ", 2)
    assert conn_max_age == "0"  # persistent connections leaked under Daphne
    assert "'max_size': 7" in pool
    assert health_checks == "True"  # with the pool, the pool's check (hub.lib.db_pool)


def test_the_pool_lends_with_the_hubs_check_once_connected() -> None:
    # A real query through Django's pool in a hub process: the pool Django built now checks
    # with hub.lib.db_pool (Django takes no check of ours in OPTIONS["pool"]).
    code = (
        "from django.db import connection; from hub.lib import compat_psycopg_pool, db_pool; "
        "connection.cursor().execute('SELECT 1'); connection.close(); "
        "connection.cursor().execute('SELECT 1'); "
        "print(compat_psycopg_pool.check_of(connection.pool) is db_pool.check_unless_recent, "
        "db_pool.skipped)"
    )
    env = hub_env(DEBUG="1", DATABASE_POOL_MAX_SIZE="1", DATABASE_POOL_MIN_SIZE="1")
    result = _manage(env, "shell", "-c", code)  # one connection: lent twice
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "True 1"  # the second lending: no query


def test_a_pool_size_of_zero_connects_per_use() -> None:
    result = _database_setting(hub_env(DEBUG="1", DATABASE_POOL_MAX_SIZE="0"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "0 True None"  # Django's own check


def test_the_old_persistent_connection_setting_is_refused_with_the_new_one_named() -> None:
    result = _manage(hub_env(DEBUG="1", DATABASE_CONN_MAX_AGE="60"), "check")
    assert result.returncode != 0
    assert "DATABASE_POOL_MAX_SIZE" in result.stderr


def test_a_secret_key_shorter_than_the_message_says_is_refused() -> None:
    result = _manage(_without_secrets(SECRET_KEY="k" * 49, DEBUG="0"), "check")
    assert result.returncode != 0
    assert "50+ characters" in result.stderr
    assert _manage(_without_secrets(SECRET_KEY="k" * 50, DEBUG="0"), "check").returncode == 0


def test_an_edge_timeout_below_620_s_is_refused() -> None:
    result = _manage(hub_env(DEBUG="1", TUNNEL_EDGE_TIMEOUT_S="619"), "check")
    assert result.returncode != 0
    assert "TUNNEL_EDGE_TIMEOUT_S 619 is below 620 s" in result.stderr
    assert _manage(hub_env(DEBUG="1", TUNNEL_EDGE_TIMEOUT_S="620"), "check").returncode == 0


def test_a_default_disk_allowance_out_of_bounds_is_refused() -> None:
    result = _manage(hub_env(DEBUG="1", GPU_DISK_ALLOWANCE_DEFAULT_BYTES="1048576"), "check")
    assert result.returncode != 0
    assert "GPU_DISK_ALLOWANCE_DEFAULT_BYTES is 1048576: a disk allowance must be between" in (
        result.stderr
    )
    ok = hub_env(DEBUG="1", GPU_DISK_ALLOWANCE_DEFAULT_BYTES=str(2 << 30))
    assert _manage(ok, "check").returncode == 0
