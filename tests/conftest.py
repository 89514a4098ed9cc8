from __future__ import annotations

import io
import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from tests.support import run_order
from tests.support.docker_cleanup import TEST_IMAGE_LABEL


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(run_order, "cloudgpu-run-order")
    # The hub pools its connections per process; this process makes and drops the test database
    # (a pool opened before that would keep lending connections to the wrong one), so it
    # connects per use. The hubs the tests start (tests/support/hub_stack.py) run with the pool.
    from django.conf import settings

    settings.DATABASES["default"]["OPTIONS"].pop("pool", None)
    # Sign-ups are throttled per address across runs (Redis keeps the counters); only
    # tests/hub/web/test_login_limits.py, which lowers it, tests the throttle.
    settings.SIGNUP_RATE_LIMIT = 100_000
    # Passwords hashed here (create_user, admin_client, sign-ups through the test client) take
    # Django's million PBKDF2 rounds, most of a second on the 2-core VM; a thousand will do.
    # Still pbkdf2_sha256, so the hubs the tests start verify them (the rounds are in the hash).
    settings.PASSWORD_HASHERS = ["tests.conftest.FastPBKDF2PasswordHasher"]


# --- Lanes (docs/testing.md, "What `make test` runs"). Every test gets one of unit / services /
# e2e / browser; `make test-fast` runs `-m "(unit or services) and not docker and not slow"`.
# The lane, first match:
#   a lane marker written on the test (or its module's pytestmark) wins;
#   the `browser` fixture (tests/web/conftest.py) -> browser;
#   tests/e2e/, or a module in E2E_ELSEWHERE -> e2e;
#   the database (a django_db mark, the db/transactional_db fixtures) or Redis (a module that
#   does `import redis`) -> services;
#   anything else -> unit.
# Besides: the docker_client or busybox_image fixture (directly or through another) -> docker;
# a node id starting with an entry of SLOW -> slow.
LANES = ("unit", "services", "e2e", "browser")
TESTS_ROOT = Path(__file__).resolve().parent
# Outside tests/e2e but starting a hub (hub_stack, web_only) or its processes (Daphne, Celery,
# hub.runner with embedded services) the way the end-to-end tests do.
E2E_ELSEWHERE = {
    "hub/api/test_schema_live.py",
    "hub/installer/test_install_script.py",
    "hub/test_celery_roundtrip.py",
    "hub/test_channels_cross_process.py",
    "hub/test_serve_redaction.py",
    "hub/test_runner.py",
    "web/test_install_command.py",
}
# Unit and services tests that take seconds by design (--durations on the 2-core VM): keep
# `make test-fast` under 90 s by leaving them to `make test`.
SLOW = (
    "agent/test_upgrade.py",  # builds virtualenvs, runs a hub peer and agents: ~40 s
    "agent/test_package.py",  # pip-installs the agent into a fresh virtualenv: ~20 s
    "agent/test_smoke.py::test_smoke_exits_3_when_",  # waits out the 10 s answer limit, twice
    "hub/billing/test_money_rules.py::test_money_rules_hold_over_random_market_histories",
    "hub/billing/test_metering.py::test_many_small_batches_charge_what_one_big_batch_does",
    "hub/health/test_healthz.py::test_healthz_names_both_when_neither_is_reachable",
    "hub/agents/test_hostile_agents.py::test_a_hostile_agents_heartbeats_are_stored_",
    "hub/agents/test_agent_socket.py::test_malformed_frames_get_an_error_reply_",
    # Real agent or ssh processes against an in-test hub peer or sshd: 1-2.5 s each.
    "agent/test_agent_mock.py",
    "agent/test_tunnels.py",
    "agent/test_logjson.py::test_the_agent_logs_json_lines_",
    "hub/installer/test_agent_wheel.py",  # builds the agent wheel
    # The cloudgpu command run as a process (its start is most of a second), many times each.
    "cli/test_commands.py",
    "cli/test_failures.py",
    "cli/test_ssh.py",
    "cli/test_terminal.py",
    "hub/test_celery_ack_watchdog.py",  # kills Redis under a worker until an ack is lost: ~15 s
    # Each runs Django in a subprocess, 1.5-3 s.
    "hub/test_settings.py::test_a_pool_size_of_zero_",
    "hub/test_settings.py::test_a_secret_key_shorter_",
    "hub/test_settings.py::test_check_deploy_",
    "hub/test_settings.py::test_connections_are_pooled_",
    "hub/test_settings.py::test_debug_tolerates_",
    # Wait out a socket timeout or push a flood through the consumer: ~2 s each.
    "hub/agents/test_agent_socket.py::test_a_socket_that_never_registers_",
    "hub/agents/test_agent_socket.py::test_after_a_flood_close_",
    "hub/agents/test_agent_socket.py::test_another_token_cannot_take_over_",
    "hub/agents/test_agent_socket.py::test_log_chunks_",
)
DB_FIXTURES = {"db", "transactional_db", "live_server"}
# Under pytest-xdist (`make test`: `-n` workers, `--dist loadgroup`), the tests that use this
# machine's Docker engine run on two workers, by file (a module's fixtures are set up once):
# their agents share the `cloudgpu` network and the CLOUDGPU-* packet-filter chains (rewritten
# whole, atomically, at each lease start; tests/e2e/test_hostile_tenant.py allows a range again
# until it is reached), and the disk guard's tests measure a disk others write to (their floors
# sit relative to what is free at the time). Compose brings up a hub of its own on a third.
# Everything else is isolated per worker: the database (pytest-django's test_<name>_gwN), Redis
# keys (tests/xdist_worker_env.py), ports, state and lock folders.
COMPOSE_TESTS = "e2e/test_compose.py"
# The rental suites through a live hub; the agent's, the runner's, the browser's and the
# hostile-host ones make up the other Docker worker's share (about even, by --durations).
DOCKER_RENTAL_SUITES = (
    "e2e/test_renter_volumes.py",
    "e2e/test_renter_ssh.py",
    "e2e/test_tunnels.py",
    "e2e/test_renter_caches.py",
    "e2e/test_hostile_tenant.py",
    "e2e/test_terminals.py",
    "e2e/test_prometheus.py",
    "e2e/test_control_plane.py",
)


def _host_group(where: str) -> str:
    if where.startswith(COMPOSE_TESTS):
        return "compose"
    return "docker-rentals" if where.startswith(DOCKER_RENTAL_SUITES) else "docker"


DOCKER_FIXTURES = {"docker_client", "busybox_image"}


def _lane(item: pytest.Item, where: str) -> str:
    fixtures = set(getattr(item, "fixturenames", ()))
    if "browser" in fixtures:
        return "browser"
    if where.startswith("e2e/") or where in E2E_ELSEWHERE:
        return "e2e"
    if item.get_closest_marker("django_db") or fixtures & DB_FIXTURES:
        return "services"
    module = getattr(item, "module", None)
    redis = sys.modules.get("redis")
    if module is not None and redis is not None and redis in vars(module).values():
        return "services"
    return "unit"


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        where = item.path.resolve().relative_to(TESTS_ROOT).as_posix()
        if not any(item.get_closest_marker(lane) for lane in LANES):
            item.add_marker(getattr(pytest.mark, _lane(item, where)))
        if set(getattr(item, "fixturenames", ())) & DOCKER_FIXTURES:
            item.add_marker(pytest.mark.docker)
        if item.get_closest_marker("docker"):
            item.add_marker(pytest.mark.xdist_group(_host_group(where)))
        node = where + item.nodeid.partition(".py")[2]
        if node.startswith(SLOW):
            item.add_marker(pytest.mark.slow)


class FastPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1000


BUSYBOX_STATIC = Path("/bin/busybox")
TEST_IMAGE = "cloudgpu-test/busybox:latest"


def _docker_unavailable(reason: str) -> None:
    if os.environ.get("CLOUDGPU_REQUIRE_DOCKER") == "1":
        pytest.fail(f"CLOUDGPU_REQUIRE_DOCKER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[object]:
    """A client for the real Docker engine; skips (or fails under CI) without one."""
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except DockerException as exc:
        _docker_unavailable(f"no Docker engine reachable ({exc})")
    yield client
    client.close()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Whatever a test's own clean-up missed (a failure halfway, a container an agent started
    after the test had listed them): nothing of the test image outlives the run. Only the test
    image, so a developer's own hub and its rentals on this engine are left alone. Run once,
    by the process that ran the tests or, under xdist, by the controller after every worker
    has finished (a worker's own session end would take containers from under another's)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    controller = session.config.pluginmanager.hasplugin("dsession")  # xdist's, with -n
    if not controller and not any(item.get_closest_marker("docker") for item in session.items):
        return  # no Docker test ran here (`make test-fast`): someone else's containers stay
    import docker
    from docker.errors import DockerException

    from tests.support.docker_cleanup import remove_containers

    try:
        client = docker.from_env(timeout=30)
        try:
            remove_containers(client, {"label": TEST_IMAGE_LABEL})
        finally:
            client.close()
    except DockerException:
        return  # no engine: no containers


@pytest.fixture(scope="session")
def busybox_image(docker_client: object) -> str:
    """A tiny image built locally from Debian's busybox-static: no registry is reachable."""
    if not BUSYBOX_STATIC.is_file():
        _docker_unavailable(f"{BUSYBOX_STATIC} is missing (apt-get install busybox-static)")
    dockerfile = (
        b"FROM scratch\n"
        # Containers carry their image's labels: the session's clean-up finds every container
        # of any build of this image by it (two xdist workers build the tag at once, and the
        # tag then names only one of the two images).
        b"LABEL " + TEST_IMAGE_LABEL.encode() + b"=1\n"
        b"COPY busybox /bin/busybox\n"
        b'RUN ["/bin/busybox", "--install", "-s", "/bin"]\n'
        b'CMD ["/bin/sh"]\n'
    )
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (("Dockerfile", dockerfile), ("busybox", BUSYBOX_STATIC.read_bytes())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    docker_client.images.build(fileobj=context, custom_context=True, tag=TEST_IMAGE, rm=True)  # type: ignore[attr-defined]
    return TEST_IMAGE


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A fresh hub state folder that an unprivileged service user can enter.

    pytest's tmp_path lives under a 0700 folder; the embedded Postgres runs as a system user
    when the tests run as root, so the folder is made under a traversable /tmp path instead.
    """
    parent = Path(tempfile.mkdtemp(prefix="cloudgpu-test-"))
    parent.chmod(0o755)
    try:
        yield parent / "state"
    finally:
        from tests.support.runner_process import remove_moved_folders

        # What a runner on it kept outside it (a /tmp state breaks sshd's rules) goes too.
        remove_moved_folders(parent / "state")
        shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_channel_layer_after_a_dead_receive() -> Iterator[None]:
    """A test whose event loop ended while a consumer still waited in the channel layer's
    ``receive()`` leaves the process-wide layer counting that receive, its lock bound to the
    dead loop: the next receive in this process, another test's, would fail ("Two event loops
    are trying to receive()", or the lock "bound to a different event loop"; seen once, in
    tests/hub/agents/test_handshake_drop.py, when the suite's order changed). The hub's loops
    live as long as their process, so only tests end loops this way; the next test gets a
    fresh layer."""
    yield
    layers = sys.modules.get("channels.layers")
    if layers is None:
        return
    from hub.lib.compat_channels_redis import receive_left_waiting

    manager = layers.channel_layers
    if any(receive_left_waiting(layer) for layer in manager.backends.values()):
        manager.backends.clear()  # as channels' own reset when CHANNEL_LAYERS changes


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's own, and before it drops the test database, the sessions on it that a
    test's helpers left open are ended. Several consumers connecting at once in one test (a
    storm's handshakes, tests/hub/agents/test_agent_socket.py) leave the thread-sensitive
    ``database_sync_to_async`` calls after them each opening a connection in a context copy
    that its clean-up does not see (asgiref 3.13; hub/agents/db_threads.py closes the hub's own
    inside the call instead). The next test's replaces it, but the last one outlives the
    session and the drop fails with "being accessed by other users".

    In between, every flush of the database puts the catalogue's seeded templates back
    (tests/support/db.py)."""
    from django.apps import apps
    from django.db.models.signals import post_migrate

    from tests.support.db import reseed_after_flush

    post_migrate.connect(
        reseed_after_flush, sender=apps.get_app_config("catalog"), dispatch_uid="test-reseed"
    )
    yield
    from django.db import connection

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
