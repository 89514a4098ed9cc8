"""The dev runner behind `make run` and `make test`.

    python -m hub.runner serve [--state DIR] [--host H] [--port P] [--web N]
    python -m hub.runner exec [--state DIR] -- COMMAND ...

Without DATABASE_URL / REDIS_URL it starts the embedded Postgres and Redis under the state
folder (data survives between runs); with them set it uses those services. `serve` then applies
migrations, creates the demo accounts, starts Daphne, a Celery worker, Celery beat, the tunnel
gateway where it can run (hub/lib/demo_gateway.py) and a demo agent (their output in log files
under the state folder), prints a summary ending with the demo passwords on the run that makes
them, and on Ctrl-C (SIGINT) or SIGTERM stops every process it started. `exec` runs one
command (the test suite) with the same environment and stops the services afterwards.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from hub.lib import demo_gateway, web_proxy
from hub.lib import metrics_dir as metrics
from hub.lib.embedded import EmbeddedPostgres, EmbeddedRedis, EmbeddedServiceError
from hub.lib.ports import wait_for_port
from hub.lib.supervise import Supervisor
from supplier_agent.config import is_loopback

BASE_DIR = Path(__file__).resolve().parent.parent
DEFAULT_STATE_DIR = BASE_DIR / ".state"


# How long Ctrl-C waits for the demo agent to stop its rentals' containers.
END_RENTALS_WAIT_S = 30.0


def _lock_state(state: Path) -> IO[str]:
    lock = open(state / "runner.lock", "w")  # noqa: SIM115 - held for the runner's lifetime
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(
            f"another hub runner is using {state}; stop it first or pass --state OTHER_DIR"
        ) from None
    return lock


def _secret_key_file(state: Path) -> Path:
    path = state / "secret_key"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(50) + "\n")
    return path


def prepare_environment(state: Path, supervisor: Supervisor) -> dict[str, str]:
    """The environment every hub process gets; starts embedded services where none is set."""
    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "hub.settings")
    env["PYTHONUNBUFFERED"] = "1"
    if not env.get("SECRET_KEY") and not env.get("SECRET_KEY_FILE"):
        env["SECRET_KEY_FILE"] = str(_secret_key_file(state))
    if not env.get("DATABASE_URL") and not env.get("DATABASE_URL_FILE"):
        print(f"Starting embedded Postgres in {state / 'postgres'} ...", flush=True)
        env["DATABASE_URL"] = EmbeddedPostgres(state / "postgres").start(supervisor)
    if not env.get("REDIS_URL") and not env.get("REDIS_URL_FILE"):
        print(f"Starting embedded Redis in {state / 'redis'} ...", flush=True)
        env["REDIS_URL"] = EmbeddedRedis(state / "redis").start(supervisor)
    return env


class _StopRequested(Exception):
    pass


def _install_stop_handlers(stop: threading.Event) -> None:
    def handler(signum: int, _frame: object) -> None:
        stop.set()
        # Interrupt a blocking step (migrations) too; the main loop just sees the event.
        raise _StopRequested(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _manage(env: dict[str, str], log_path: Path | None, *args: str) -> str:
    """Run a management command, its output kept off the terminal (where it would bury the
    summary) and appended to ``log_path`` where given; returns that output. A failure raises
    with its end."""
    result = subprocess.run(
        [sys.executable, str(BASE_DIR / "manage.py"), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if log_path is not None:
        with log_path.open("a") as log:
            log.write(result.stdout)
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-20:])
        raise subprocess.CalledProcessError(result.returncode, f"manage.py {args[0]}:\n{tail}")
    return result.stdout


def _plan_mail(env: dict[str, str], state: Path, host: str) -> str:
    """The trial's notices: emails printed in the worker's log unless an SMTP server is
    configured, and webhooks allowed to a receiver on this machine (http to loopback) when
    the hub listens on loopback only (anyone who can sign up could aim them at this
    machine's own services otherwise)."""
    if is_loopback(host):
        env.setdefault("WEBHOOK_ALLOW_LOOPBACK", "1")
    if "EMAIL_BACKEND" not in env and not env.get("EMAIL_HOST"):
        env["EMAIL_BACKEND"] = "django.core.mail.backends.console.EmailBackend"
    if env.get("EMAIL_BACKEND", "").endswith("console.EmailBackend"):
        return f"  mail       printed in {state / 'worker.log'} (set EMAIL_HOST to send it)"
    server = f"{env.get('EMAIL_HOST', 'localhost')}:{env.get('EMAIL_PORT', '25')}"
    return f"  mail       sent through {server}"


def _demo_account_lines(env: dict[str, str], state: Path) -> list[str]:
    """Create the demo accounts where missing; the summary's lines about them: their passwords
    on the run that creates them (at the end, where they do not scroll away), else how to set
    a new one."""
    # Not logged: its output holds the passwords.
    output = _manage(env, None, "create_demo_accounts")
    created = [line.strip() for line in output.splitlines() if "demo-account " in line]
    if created:
        return [
            "  accounts   shown on this run only, so copy them now:",
            *(f"    {line}" for line in created),
        ]
    # As typed in the checkout, where `make run` runs: .venv/bin/python, not a long path.
    python = sys.executable
    if Path(python).is_relative_to(BASE_DIR):
        python = os.path.relpath(python, BASE_DIR)
    state_arg = "" if state == DEFAULT_STATE_DIR.resolve() else f" --state {state}"
    return [
        "  accounts   admin, renter, supplier (passwords were shown when they were made); for a",
        "             new one, stop the hub and run: "
        f"{python} -m hub.runner exec{state_arg} -- {python} manage.py changepassword admin",
    ]


# Where the hub's secrets are in the environment: neither the agent nor the gateway gets them.
_HUB_SECRETS = ("DATABASE_", "REDIS_", "SECRET_", "TUNNEL_GATEWAY_SECRET")

# Run by the demo agent's interpreter: can it use Docker, and does NVML see a GPU to rent?
_DOCKER_PROBE = """
import json
out = {}
try:
    import docker
    docker.from_env(timeout=5).ping()
    out["docker"] = None
except Exception as exc:
    out["docker"] = f"{type(exc).__name__}: {exc}"
try:
    import pynvml
    pynvml.nvmlInit()
    out["gpus"] = pynvml.nvmlDeviceGetCount()
except Exception as exc:
    out["gpus"] = 0
print(json.dumps(out))
"""


# On a machine without an NVIDIA GPU the demo's Docker agent rents one simulated GPU: CloudGPU's
# one fake, NVML replaced at the pynvml boundary by a device table (tests/fakes/nvml/pynvml.py),
# so renters get real containers (a shell, URLs) from a laptop. Named so nobody mistakes it.
DEMO_GPU_NAME = "Demo GPU (simulated: this machine has no NVIDIA GPU)"
FAKE_NVML_DIR = BASE_DIR / "tests" / "fakes" / "nvml"


def _simulated_gpu(agent_state: Path) -> dict[str, str]:
    """The environment that gives the demo agent one simulated GPU (a table in its state)."""
    agent_state.mkdir(parents=True, exist_ok=True)
    table = agent_state / "demo-gpus.json"
    if not table.exists():
        gpu_uuid = f"GPU-{uuid.uuid4()}"
        table.write_text(
            json.dumps(
                {
                    "driver_version": "demo",
                    "cuda_driver_version": 0,
                    "gpus": [
                        {
                            "uuid": gpu_uuid,
                            "name": DEMO_GPU_NAME,
                            "memory_total": 8 * 1024**3,
                            "memory_used": 0,
                            "utilization": 0,
                            "compute_mode": 0,
                            "compute_mode_settable": False,
                            "processes": [],
                        }
                    ],
                }
            )
        )
    return {
        "PYTHONPATH": os.pathsep.join([str(FAKE_NVML_DIR), str(BASE_DIR)]),
        "CLOUDGPU_FAKE_NVML_TABLE": str(table),
    }


def demo_agent_runtime(
    env: dict[str, str], agent_state: Path | None = None
) -> tuple[dict[str, str], str]:
    """The demo agent's runtime settings (as CLOUDGPU_* variables, over its config file) and a
    line saying which and why: Docker with --gpu-devices none where an engine answers (with one
    simulated GPU where NVML lists none, given ``agent_state``), else the mock runtime."""
    mock = {"CLOUDGPU_RUNTIME": "mock"}
    try:
        probe = subprocess.run(
            [sys.executable, "-c", _DOCKER_PROBE],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        found = json.loads(probe.stdout)
    except (subprocess.TimeoutExpired, ValueError):
        return mock, "mock runtime (the Docker/NVML probe did not answer)"
    if found.get("docker"):
        return mock, "mock runtime (no Docker engine reachable)"
    if os.geteuid() != 0:
        # The Docker runtime installs the rentals' egress filter with iptables, as root; a
        # user's demo would refuse every rental.
        return mock, "mock runtime (the Docker runtime needs root: run make run as root for it)"
    simulated: dict[str, str] = {}
    if not found.get("gpus"):
        if agent_state is None:
            return mock, (
                "mock runtime (Docker is reachable, but NVML lists no GPU, and the Docker "
                "runtime rents only GPUs NVML lists)"
            )
        simulated = _simulated_gpu(agent_state)
    docker_settings = {
        "CLOUDGPU_RUNTIME": "docker",
        # Containers without the GPU device (no container toolkit needed), the host's GPU
        # compute modes untouched: a demo, not a supplier.
        "CLOUDGPU_GPU_DEVICES": "none",
        "CLOUDGPU_COMPUTE_MODE": "skip",
        # The trial has no registry to pull from: its templates run images built on this
        # machine, which a supplier's agent refuses unless they opt in (allow_local_images).
        "CLOUDGPU_ALLOW_LOCAL_IMAGES": "1",
        # A trial machine may have less free disk than a supplier's default floor (20 GiB),
        # below which the agent takes no rentals.
        "CLOUDGPU_DISK_FLOOR_GIB": "2",
        **simulated,
    }
    local = "images of this machine rentable (allow_local_images, for the trial)"
    if simulated:
        return docker_settings, (
            "Docker runtime, --gpu-devices none, one simulated GPU (no NVIDIA GPU here): real "
            f"containers, no GPU in them; {local}"
        )
    return docker_settings, f"Docker runtime, --gpu-devices none; {local}"


def _start_demo_agent(
    supervisor: Supervisor, agent_state: Path, env: dict[str, str], hub_url: str
) -> str:
    """One agent for the demo supplier, so a fresh hub has a GPU to rent; returns its line."""
    agent = [sys.executable, "-m", "supplier_agent"]
    # The agent gets none of the hub's secrets, as on a real supplier's machine.
    agent_env = {k: v for k, v in env.items() if not k.startswith(_HUB_SECRETS)}
    runtime, described = demo_agent_runtime(agent_env, agent_state)
    agent_env.update(runtime)
    agent_env.setdefault("CLOUDGPU_LOCK_DIR", str(agent_state / "locks"))
    if not (agent_state / "cloudgpu-agent.conf").exists():
        manage = [sys.executable, str(BASE_DIR / "manage.py")]
        created = subprocess.run(
            # Free (price 0): its GPU is offered at once, and renting it needs no balance.
            [
                *manage,
                *("hub", "token", "create", "--owner", "supplier", "--name", "demo agent"),
                *("--default-price", "0"),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        subprocess.run(
            [
                *agent,
                "configure",
                "--state",
                str(agent_state),
                "--hub",
                hub_url,
                "--runtime",
                "mock",
            ],
            input=created.stdout.strip() + "\n",  # the token goes through stdin, never argv
            env=agent_env,
            capture_output=True,
            text=True,
            check=True,
        )
    (agent_state / "locks").mkdir(exist_ok=True)
    supervisor.start(
        "demo-agent",
        [*agent, "run", "--state", str(agent_state), "--hub", hub_url],
        env=agent_env,
        log_path=agent_state / "agent.log",
    )
    return described


def _plan_gateway(state: Path, env: dict[str, str], port: int) -> demo_gateway.DemoGateway | None:
    """The demo's tunnel gateway, its settings put into ``env``; None (and a line saying why
    and what to install) where it cannot run. A hub pointed at a gateway of its own keeps it."""
    if env.get("TUNNEL_DOMAIN") or env.get("HUB_DEMO_GATEWAY", "1") == "0":
        return None
    ssh_port = int(env.get("HUB_GATEWAY_SSH_PORT", "2222"))
    http_port = int(env.get("HUB_GATEWAY_HTTP_PORT", str(port + 80)))
    try:
        gateway = demo_gateway.plan(state, ssh_port, http_port)
    except demo_gateway.GatewayUnavailable as exc:
        print(f"hub runner: no tunnel gateway, so rentals get no URL: {exc}", flush=True)
        return None
    env.update(gateway.hub_settings())
    return gateway


# --web N: more than this many Daphne processes on one machine buys nothing but memory.
MAX_WEB_PROCESSES = 16


def _start_web(
    supervisor: Supervisor, env: dict[str, str], state: Path, host: str, port: int, web: int
) -> None:
    """One Daphne on ``port``; or, with ``web`` > 1, that many on the loopback ports after it
    behind nginx on ``port`` (hub/lib/web_proxy.py), agents spread across them."""
    # hub.serve is Daphne with its logs redacted (agent tokens may be in a path).
    daphne = [sys.executable, "-m", "hub.serve"]
    if web == 1:
        # The children's banners and logs go to files under the state folder: on the terminal
        # they buried the summary and its passwords.
        supervisor.start(
            "web",
            [*daphne, "-b", host, "-p", str(port), "hub.asgi:application"],
            env=env,
            log_path=state / "web.log",
            cwd=BASE_DIR,
        )
        return
    proxy = web_proxy.plan(state / "web-proxy", host, port, web)
    proxy.write()
    for n, web_port in enumerate(proxy.upstream_ports, start=1):
        supervisor.start(
            f"web-{n}",
            # Loopback only, so that only nginx can set the client's address (--proxy-headers).
            [
                *daphne,
                "--proxy-headers",
                "-b",
                "127.0.0.1",
                "-p",
                str(web_port),
                "hub.asgi:application",
            ],
            env=env,
            log_path=state / f"web-{n}.log",
            cwd=BASE_DIR,
        )
    supervisor.start("web-proxy", proxy.argv(), log_path=state / "web-proxy.log", cwd=BASE_DIR)


def serve(state: Path, host: str, port: int, web: int = 1) -> int:
    state.mkdir(parents=True, exist_ok=True)
    lock = _lock_state(state)
    supervisor = Supervisor()
    stop = threading.Event()
    _install_stop_handlers(stop)
    env: dict[str, str] = {}
    demo_agent: Path | None = None
    try:
        env = prepare_environment(state, supervisor)
        # One folder for the metrics of web, worker (and its pool) and beat, which /metrics
        # adds up (hub/lib/metrics.py); emptied now, or the last run's counters would count.
        env.setdefault(metrics.MULTIPROC_ENV, str(state / "prometheus"))
        metrics.prepare_multiproc_dir(Path(env[metrics.MULTIPROC_ENV]))
        # DEBUG stays off unless asked for (DEBUG=1 make run): a newcomer gets the hub's own
        # error pages, never Django's debug page listing every URL pattern.
        env.setdefault("HUB_PUBLIC_URL", f"http://{host}:{port}")
        mail_line = _plan_mail(env, state, host)
        gateway = _plan_gateway(state, env, port)
        print(f"Applying migrations (log in {state / 'migrate.log'}) ...", flush=True)
        _manage(env, state / "migrate.log", "migrate", "--noinput", "--verbosity", "1")
        account_lines = _demo_account_lines(env, state)
        python = sys.executable
        _start_web(supervisor, env, state, host, port, web)
        supervisor.start(
            "worker",
            # Gossip and mingle sync workers with each other, heartbeat tells monitors that
            # it is alive: the hub uses none of them, and each held a Redis connection.
            [
                python,
                "-m",
                "celery",
                "-A",
                "hub",
                "worker",
                "-l",
                "INFO",
                "-c",
                "2",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            env=env,
            log_path=state / "worker.log",
            cwd=BASE_DIR,
        )
        supervisor.start(
            "beat",
            [
                python,
                "-m",
                "celery",
                "-A",
                "hub",
                "beat",
                "-l",
                "INFO",
                "-s",
                str(state / "celerybeat-schedule"),
            ],
            env=env,
            log_path=state / "beat.log",
            cwd=BASE_DIR,
        )
        if not wait_for_port(port, host, timeout_s=60):
            print(f"Daphne did not start listening; see {state / 'web.log'}.", file=sys.stderr)
            return 1
        base = f"http://{host}:{port}"
        lines = [
            f"  dashboard  {base}/",
            f"  admin      {base}/admin/",
            f"  health     {base}/healthz",
        ]
        if gateway is not None:
            supervisor.start(
                "gateway",
                gateway.argv(f"http://127.0.0.1:{port}"),
                env={k: v for k, v in env.items() if not k.startswith(_HUB_SECRETS)}
                | {"TUNNEL_GATEWAY_SECRET_FILE": str(gateway.secret_file)},
                log_path=state / "gateway.log",
                cwd=BASE_DIR,
            )
            lines.append(
                f"  gateway    rentals' URLs {gateway.url_pattern()}, ssh 127.0.0.1:"
                f"{gateway.ssh_port}, log in {state / 'gateway.log'}"
            )
        if env.get("HUB_DEMO_AGENT", "1") != "0":
            agent_log = state / "demo-agent" / "agent.log"
            runtime = _start_demo_agent(supervisor, state / "demo-agent", env, base)
            demo_agent = state / "demo-agent"
            lines.append(f"  demo agent {runtime}, log in {agent_log}")
        lines.append(mail_line)
        lines.append(f"  logs       web.log, worker.log, beat.log, migrate.log in {state}")
        lines.append(f"  state      {state}")
        lines.extend(account_lines)
        print(
            "\nCloudGPU hub is running:\n"
            + "\n".join(lines)
            + "\nPress Ctrl-C to stop everything.\n",
            flush=True,
        )
        # A child that dies (killed, crashed, out of memory) is started again with backoff and
        # a line here; Ctrl-C still stops everything.
        while not stop.wait(0.5):
            supervisor.restart_exited(
                lambda line: print(f"hub runner: {line}", flush=True),
                # A dead web process's connected agents leave the livesum gauge with it (the
                # next scrape would sweep too; this is sooner).
                died=lambda pid: metrics.sweep(env[metrics.MULTIPROC_ENV]),
            )
        return 0
    except _StopRequested:
        return 0
    except (EmbeddedServiceError, subprocess.CalledProcessError, web_proxy.ProxyUnavailable) as exc:
        print(f"hub runner: {exc}", file=sys.stderr)
        return 1
    finally:
        # Stopping must not itself be interrupted by a second Ctrl-C.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if demo_agent is not None:
            _end_demo_rentals(env, demo_agent)
        print("Stopping hub processes ...", flush=True)
        supervisor.stop_all()
        lock.close()
        print("Stopped.", flush=True)


def _end_demo_rentals(env: dict[str, str], agent_state: Path) -> None:
    """End the demo agent's rentals while the hub and the agent still run: their containers
    go, billing stops, and the next run shows them ended (nothing is left running)."""
    try:
        agent_id = (agent_state / "agent_id").read_text().strip()
    except OSError:
        return
    print(f"Ending the demo agent's rentals (up to {END_RENTALS_WAIT_S:.0f} s) ...", flush=True)
    try:
        result = subprocess.run(
            [
                *(sys.executable, str(BASE_DIR / "manage.py"), "hub", "lease", "release-host"),
                *(agent_id, "--wait", str(END_RENTALS_WAIT_S)),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=END_RENTALS_WAIT_S + 60,
            check=False,
            start_new_session=True,
        )
    except (subprocess.TimeoutExpired, OSError) as exc:
        # Stopping goes on regardless: the next run's agent re-adopts what is left.
        print(f"hub runner: could not end the demo agent's rentals: {exc}", flush=True)
        return
    said = (result.stdout.strip() + " " + result.stderr.strip()).strip()
    if "matches no host" in said:
        return  # the agent never registered: it has no rentals
    if result.returncode != 0:
        print(f"hub runner: {said.splitlines()[-1] if said else 'could not end them'}", flush=True)
    elif not said.startswith("0 of 0"):
        print(f"  {said}", flush=True)


def exec_command(state: Path, command: Sequence[str]) -> int:
    state.mkdir(parents=True, exist_ok=True)
    lock = _lock_state(state)
    supervisor = Supervisor()
    try:
        env = prepare_environment(state, supervisor)
        # The command shares our terminal, so Ctrl-C reaches it directly; we wait it out.
        # SIGTERM (a CI timeout, say) is passed on, and the services still stop after it.
        process = subprocess.Popen(list(command), env=env)
        signal.signal(signal.SIGTERM, lambda signum, _frame: process.send_signal(signum))
        while True:
            try:
                code = process.wait()
            except KeyboardInterrupt:
                continue
            # A command killed by a signal exits like a shell reports it: 128 + the signal.
            return 128 - code if code < 0 else code
    except EmbeddedServiceError as exc:
        print(f"hub runner: {exc}", file=sys.stderr)
        return 1
    finally:
        supervisor.stop_all()
        lock.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hub.runner", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="run the whole hub (make run)")
    serve_parser.add_argument("--host", default=os.environ.get("HUB_HOST", "127.0.0.1"))
    serve_parser.add_argument("--port", type=int, default=int(os.environ.get("HUB_PORT", "8000")))
    serve_parser.add_argument(
        "--web",
        type=int,
        default=int(os.environ.get("HUB_WEB_PROCESSES", "1")),
        metavar="N",
        help="web (Daphne) processes; more than one run behind nginx on --port",
    )
    exec_parser = commands.add_parser(
        "exec", help="run COMMAND with the hub's services (make test)"
    )
    exec_parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND")
    for sub in (serve_parser, exec_parser):
        sub.add_argument(
            "--state",
            type=Path,
            default=Path(os.environ.get("CLOUDGPU_STATE_DIR", DEFAULT_STATE_DIR)),
            help="folder for embedded Postgres/Redis data and local secrets",
        )
    args = parser.parse_args(argv)
    state = args.state.resolve()
    if args.command == "serve":
        if not 1 <= args.web <= MAX_WEB_PROCESSES:
            parser.error(f"--web takes 1 to {MAX_WEB_PROCESSES} processes")
        return serve(state, args.host, args.port, args.web)
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        parser.error("exec needs a command after --")
    return exec_command(state, command)


if __name__ == "__main__":
    sys.exit(main())
