"""The ``cloudgpu-agent`` command line.

Exit codes are part of the interface: 0 success; 1 error; 2 usage error; ``smoke`` also
3 (no answer from the hub in 10 s) and 4 (token rejected).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import logging
import os
import platform
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from supplier_agent import __version__, native_memory, profiling
from supplier_agent.config import (
    COMPUTE_MODES,
    GPU_DEVICES,
    RUNTIMES,
    AgentConfig,
    ConfigError,
    default_state_dir,
    load,
    parse_release_keys,
    validate_token,
    websocket_url,
    write_file,
)
from supplier_agent.drivers import CONNECT_MODES, check_connect_mode, runtime_for_driver
from supplier_agent.egress import parse_allowed
from supplier_agent.limits import parse_reserve
from supplier_agent.state import StateInUse

if TYPE_CHECKING:  # the runtimes import Docker or the mock lazily, per command
    from pathlib import Path

    from supplier_agent.agent import Agent
    from supplier_agent.runtime import Runtime
    from supplier_agent.state import AgentState

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NO_ANSWER, EXIT_TOKEN_REJECTED = 0, 1, 2, 3, 4


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cloudgpu-agent",
        description="CloudGPU supplier agent: rents out this host's GPUs through a CloudGPU hub.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def with_state(sub: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sub.add_argument("--state", help=f"state folder (default {default_state_dir()})")
        return sub

    configure = with_state(
        commands.add_parser(
            "configure", help="write the config file; the supplier token is read from stdin"
        )
    )
    # Not required=True: with --update the existing config may name the hub (checked in
    # cmd_configure, still a usage error without either).
    configure.add_argument("--hub", help="the hub's URL, e.g. https://hub.example.com")
    configure.add_argument("--runtime", choices=RUNTIMES, help="docker (default) or mock")
    configure.add_argument(
        "--update",
        action="store_true",
        help="start from the existing config: keep its token and every setting not given here, "
        "unknown ones included; the token on stdin is optional (an empty line keeps it)",
    )
    configure.add_argument(
        "--output",
        metavar="PATH",
        help="write the config to PATH instead of the state folder's (install.sh stages it there, "
        "checks it with CLOUDGPU_CONFIG=PATH, then renames it into place)",
    )
    configure.add_argument(
        "--driver",
        help="the seed's name for --runtime: docker or mock; nerdctl, udocker, host, none and "
        "unknown names are refused (deployments stay off rather than guess)",
    )
    configure.add_argument(
        "--connect-mode",
        choices=CONNECT_MODES,
        default="agent_dial",
        help="agent_dial: this agent connects out (the only mode; server_dial is refused: the "
        "hub never dials suppliers)",
    )
    # No argparse defaults below: --update must tell "not given" (keep) from a value.
    configure.add_argument(
        "--compute-mode", choices=COMPUTE_MODES, help=f"default {CONFIG_DEFAULTS['compute_mode']}"
    )
    configure.add_argument(
        "--gpu-devices", choices=GPU_DEVICES, help=f"default {CONFIG_DEFAULTS['gpu_devices']}"
    )
    configure.add_argument("--lock-dir", help=f"default {CONFIG_DEFAULTS['lock_dir']}")
    configure.add_argument(
        "--reserve-memory-mib",
        help="memory kept from rentals for the host and the agent (default: 10%% of RAM, "
        "at least 2048)",
    )
    configure.add_argument(
        "--reserve-cpus", help="CPUs kept from rentals (default: 1, or 0.5 below 4 CPUs)"
    )
    configure.add_argument(
        "--accept-container-escape-risk",
        action="store_true",
        help="rent out GPUs even with an NVIDIA container toolkit older than 1.17.8, whose "
        "CVE-2025-23266 lets a renter's image take over this host",
    )
    configure.add_argument(
        "--release-key",
        action="append",
        dest="release_keys",
        help="a public key (ed25519:...) agent releases must be signed with; repeat for several. "
        "With --update, the keys given replace the pinned ones",
    )
    configure.add_argument(
        "--allow-local-images",
        action="store_true",
        help="rent out images that exist only on this host (your own builds) without pulling "
        "them; by default every rental pulls its image anonymously from a public registry, so "
        "renters can never run your private images",
    )
    configure.add_argument(
        "--allow-networks",
        help="comma-separated ranges on your network that rentals may reach (default: none; "
        "the internet and DNS are always reachable)",
    )

    run = with_state(commands.add_parser("run", help="connect to the hub and serve leases"))
    run.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        default=os.environ.get("CLOUDGPU_METRICS") or None,
        help="serve Prometheus metrics (GPUs as dcgm-exporter names them, the agent's state) "
        "at http://HOST:PORT/metrics, e.g. 127.0.0.1:9835; off by default. An address other "
        "than loopback needs a token (--metrics-token-file, CLOUDGPU_METRICS_TOKEN_FILE or "
        "CLOUDGPU_METRICS_TOKEN)",
    )
    # The token itself is never an argument: the process list shows arguments to every user.
    run.add_argument(
        "--metrics-token-file",
        metavar="PATH",
        help="a file whose first line is the bearer token scrapes must send (16+ characters)",
    )
    run.add_argument("--hub")
    run.add_argument("--runtime", choices=RUNTIMES)
    run.add_argument(
        "--compute-mode",
        choices=COMPUTE_MODES,
        help="require: fail a reserve that cannot set EXCLUSIVE_PROCESS; best-effort: go on "
        "and say so; skip: never change the GPU's compute mode",
    )
    run.add_argument(
        "--gpu-devices",
        choices=GPU_DEVICES,
        help="none: start containers without GPUs (control-plane testing without the toolkit)",
    )
    run.add_argument("--lock-dir")
    run.add_argument("--log-level")
    run.add_argument(
        "--trial",
        type=_trial_seconds,
        metavar="SECONDS",
        help="start as `run` does, reach the hub with a probe (a running agent keeps its "
        "connection), stay up SECONDS, then exit 0, or 1 with the reason; takes no lock on the "
        "state folder, claims no GPU, touches no container, serves no metrics (`upgrade "
        "--no-systemd` and install.sh try a new version this way before switching to it)",
    )

    smoke = with_state(commands.add_parser("smoke", help="one handshake with the hub, then exit"))
    smoke.add_argument("--hub")

    doctor = with_state(commands.add_parser("doctor", help="report what this host can offer"))
    doctor.add_argument("--connectivity", action="store_true", help="also try the hub")

    bench = commands.add_parser(
        "bench", help="load an OpenAI-compatible endpoint; requests/s, tokens/s, TTFT, ITL"
    )
    bench.add_argument("--url", required=True, help="e.g. a rental's URL, http://host:8000/v1")
    bench.add_argument("--model", required=True)
    bench.add_argument("--concurrency", type=int, default=1, help="closed loop (default 1)")
    bench.add_argument("--rate", type=float, help="open loop: new requests a second")
    bench.add_argument("--isl", type=int, default=128, help="prompt tokens (default 128)")
    bench.add_argument("--osl", type=int, default=32, help="output tokens (default 32)")
    bench.add_argument("--dataset", default="random", help="random (the only one)")
    bench.add_argument("--requests", type=int, default=32, help="requests in all (default 32)")
    bench.add_argument("--timeout", type=float, default=600, help="seconds per request")
    bench.add_argument(
        "--api-key", help="sent as Bearer; default: the OPENAI_API_KEY environment variable"
    )
    bench.add_argument("--json", action="store_true", help="print the summary as JSON")

    commands.add_parser("version", help="print the agent version and exit")

    def with_install(sub: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sub.add_argument(
            "--no-systemd",
            action="store_true",
            help="do not run systemctl; only write files and say what would run",
        )
        return sub

    install = with_state(
        with_install(commands.add_parser("install-service", help="install the systemd unit"))
    )
    install.add_argument("--prefix", default="/opt/cloudgpu-agent", help="installation folder")
    # No default here: with --no-systemd and no --unit-dir nothing under /etc is touched.
    unit_dir_help = "unit folder (default /etc/systemd/system; none with --no-systemd)"
    install.add_argument("--unit-dir", help=unit_dir_help)
    uninstall = with_install(
        commands.add_parser("uninstall-service", help="stop and remove the systemd unit")
    )
    uninstall.add_argument("--unit-dir", help=unit_dir_help)
    upgrade = with_state(
        with_install(commands.add_parser("upgrade", help="install the hub's current agent version"))
    )
    upgrade.add_argument("--prefix", default="/opt/cloudgpu-agent", help="installation folder")
    upgrade.add_argument(
        "--release-url", help="release description to use (default <hub>/agent/release.json)"
    )
    upgrade.add_argument(
        "--force", action="store_true", help="reinstall even if the version is the same"
    )
    upgrade.add_argument(
        "--allow-downgrade", action="store_true", help="install the hub's version even if older"
    )
    upgrade.add_argument(
        "--expect-version",
        metavar="V",
        help="refuse unless the hub serves version V (a hub rollout's own upgrades pass it)",
    )
    upgrade.add_argument(
        "--timeout",
        type=float,
        default=600,
        metavar="S",
        help="give up and roll back after S seconds in all (default 600)",
    )
    upgrade.add_argument(
        "--health-window",
        type=float,
        default=30,
        metavar="S",
        help="after the restart, roll back unless the service stays up S seconds (default "
        "30); with --no-systemd the new version runs `run --trial S` before the switch instead",
    )
    return parser


def _flags(args: argparse.Namespace) -> dict[str, str | None]:
    keys = ("state", "hub", "runtime", "compute_mode", "gpu_devices", "lock_dir", "log_level")
    return {key: getattr(args, key, None) for key in keys}


def _read_token() -> str:
    if sys.stdin is None:
        raise ConfigError("no stdin to read the token from")
    if sys.stdin.isatty():
        return getpass.getpass("Supplier token: ")
    return sys.stdin.readline()


# What a new config says for settings not given (load() has the same defaults). An --update
# never adds them: a key the existing file lacks keeps meaning "the agent's default".
CONFIG_DEFAULTS = {
    "runtime": "docker",
    "compute_mode": "best-effort",
    "gpu_devices": "nvidia",
    "lock_dir": "/var/lock",
}


def cmd_configure(args: argparse.Namespace) -> int:
    from pathlib import Path

    from supplier_agent.config import CONFIG_NAME, read_file

    if args.driver and args.runtime and args.driver != args.runtime:
        print(
            f"cloudgpu-agent: --driver {args.driver} and --runtime {args.runtime} disagree; "
            "give one",
            file=sys.stderr,
        )
        return EXIT_USAGE
    state_dir = Path(args.state) if args.state else default_state_dir()
    # --update starts from the state folder's config, never from --output's (that one is new).
    existing = state_dir / CONFIG_NAME
    base = read_file(state_dir, existing) if args.update else {}
    hub = args.hub or base.get("hub")
    if not hub:
        where = f" ({existing} names no hub)" if args.update else ""
        print(f"cloudgpu-agent configure: --hub URL is needed{where}", file=sys.stderr)
        return EXIT_USAGE
    runtime = runtime_for_driver(args.driver) if args.driver else args.runtime
    check_connect_mode(args.connect_mode)
    websocket_url(hub)
    text = _read_token()
    if args.update and not text.strip() and base.get("token"):
        text = base["token"]  # an empty line (or none) keeps the current token
    token = validate_token(text)
    try:
        parse_reserve(args.reserve_memory_mib, args.reserve_cpus)
        parse_allowed(args.allow_networks)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.release_keys:
        args.release_keys = ",".join(parse_release_keys(",".join(args.release_keys)))
    output = Path(args.output) if args.output else None
    try:
        path = _write_config(
            state_dir, args, hub, runtime, token, output, existing if args.update else None, base
        )
    except OSError as exc:
        # Exit 1 with the reason, not a traceback: installers show this line to suppliers.
        folder = output.parent if output else state_dir
        raise ConfigError(f"cannot write the config in {folder}: {exc.strerror}") from None
    print(f"wrote {path} (mode 0600)")
    return EXIT_OK


def _write_config(
    state_dir: Path,
    args: argparse.Namespace,
    hub: str,
    runtime: str | None,
    token: str,
    output: Path | None,
    base_path: Path | None,
    base: dict[str, str],
) -> Path:
    """Only what was given goes over ``base`` (the existing settings, with --update); a new
    config (no base) also gets CONFIG_DEFAULTS, as before --update existed."""
    given = {
        "hub": hub,
        "token": token,
        "runtime": runtime,
        "compute_mode": args.compute_mode,
        "gpu_devices": args.gpu_devices,
        "lock_dir": args.lock_dir,
        "reserve_memory_mib": args.reserve_memory_mib,
        "reserve_cpus": args.reserve_cpus,
        "allow_networks": args.allow_networks,
        "accept_container_escape_risk": "1" if args.accept_container_escape_risk else None,
        "allow_local_images": "1" if args.allow_local_images else None,
        "release_keys": args.release_keys,
    }
    values = {key: value for key, value in given.items() if value}
    if not base:
        values = {"hub": hub, "token": token, **CONFIG_DEFAULTS, **values}
    return write_file(state_dir, values, path=output, base=base_path)


def cmd_bench(args: argparse.Namespace) -> int:
    """0 every request answered; 1 some failed (the summary says how); 2 unusable settings."""
    import json

    from supplier_agent.bench import BenchError, BenchOptions, format_table, run_bench

    options = BenchOptions(
        url=args.url,
        model=args.model,
        concurrency=args.concurrency,
        isl=args.isl,
        osl=args.osl,
        dataset=args.dataset,
        rate=args.rate,
        requests=args.requests,
        api_key=args.api_key or os.environ.get("OPENAI_API_KEY", ""),
        timeout_s=args.timeout,
    )
    try:
        summary = run_bench(options)
    except BenchError as exc:
        print(f"cloudgpu-agent bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(summary, indent=2) if args.json else format_table(summary))
    return EXIT_OK if summary["errors"] == 0 else EXIT_ERROR


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # LOG_FORMAT=json, as for the hub's processes: one JSON object a line (logjson.py).
    log_format = os.environ.get("CLOUDGPU_LOG_FORMAT") or os.environ.get("LOG_FORMAT") or ""
    if log_format.strip().lower() == "json":
        from supplier_agent.logjson import JsonFormatter

        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
    # websockets logs handshake details at DEBUG, headers included: keep it quiet.
    logging.getLogger("websockets").setLevel(logging.WARNING)


MAX_TRIAL_S = 3600.0


def _trial_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    # 0: start up and reach the hub, then exit (`upgrade --health-window 0`).
    if not 0 <= seconds <= MAX_TRIAL_S:
        raise argparse.ArgumentTypeError(f"0 to {MAX_TRIAL_S:g} seconds, not {text}")
    return seconds


def _start_agent(config: AgentConfig, *, trial: bool) -> tuple[AgentState, Runtime, Agent]:
    """``run``'s start-up after logging, shared with ``run --trial`` so that a version whose
    start-up crashes fails its trial: the state, the runtime (Docker client, NVML), the Agent."""
    from supplier_agent.agent import Agent
    from supplier_agent.logjson import bind
    from supplier_agent.state import AgentState, lock_state_dir

    if not trial:
        lock_state_dir(config.state_dir)  # held until the process exits
    # A trial reads the state as smoke does: the agent it may replace could be running on it.
    state = AgentState(config.state_dir, read_only=trial)
    bind(agent_id=state.agent_id)
    runtime = make_runtime(config, state.agent_id)
    return state, runtime, Agent(config, runtime, state)


def _run_trial(config: AgentConfig, window_s: float) -> int:
    """``run --trial``: 0 if this version started and held up for ``window_s``; else 1 and one
    line on stderr saying why (after the traceback, in the log, when it crashed)."""
    from websockets.exceptions import ConnectionClosed, InvalidHandshake

    from supplier_agent.agent import TrialFailed
    from supplier_agent.hub_link import TokenRejected
    from supplier_agent.protocol import ProtocolError

    log = logging.getLogger("cloudgpu.agent")

    async def trial(agent: Agent) -> str:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        return await agent.trial(window_s, stop)

    try:
        state, _runtime, agent = _start_agent(config, trial=True)
        log.info(
            "cloudgpu-agent %s trial run for %g s (runtime %s, hub %s, agent id %s)",
            *(__version__, window_s, config.runtime, config.ws_url, state.agent_id),
        )
        host_id = asyncio.run(trial(agent))
    except (ConfigError, StateInUse):
        raise  # main() prints these as for `run`
    except TokenRejected as exc:
        reason = f"{exc}; check the token with `cloudgpu-agent smoke`"
    except (TimeoutError, asyncio.TimeoutError):
        reason = f"no answer from {config.ws_url} within 10 s"
    except (OSError, InvalidHandshake, ConnectionClosed, ProtocolError) as exc:
        reason = f"could not reach the hub at {config.ws_url}: {type(exc).__name__}: {exc}"
    except TrialFailed as exc:
        reason = str(exc)
    except Exception as exc:
        log.exception("the trial run crashed")  # the traceback, for the log
        first = (str(exc).splitlines() or [""])[0]
        reason = f"it crashed: {type(exc).__name__}" + (f": {first}" if first else "")
    else:
        print(
            f"run --trial: cloudgpu-agent {__version__} started and stayed up {window_s:g} s "
            f"(the hub knows this machine as host {host_id})"
        )
        return EXIT_OK
    print(
        f"cloudgpu-agent run --trial: version {__version__} did not hold up: {reason}",
        file=sys.stderr,
    )
    return EXIT_ERROR


def cmd_run(
    config: AgentConfig,
    metrics_address: str | None = None,
    metrics_token_file: str | None = None,
    trial_s: float | None = None,
) -> int:
    """Serve leases until a signal; with ``trial_s``, ``run --trial`` (see _run_trial). Both go
    through here and _start_agent, so a crash on either path fails the trial."""
    native_memory.limit_arenas()  # before any thread: each thread's arena is made on first use
    _setup_logging(config.log_level)
    if trial_s is not None:
        return _run_trial(config, trial_s)
    state, runtime, agent = _start_agent(config, trial=False)
    metrics_server = None
    if metrics_address:
        from supplier_agent import metrics

        try:
            metrics_server = metrics.serve(
                metrics_address,
                metrics.AgentCollector(
                    metrics.AgentView(
                        connected=agent.connected.is_set,
                        reconnects=lambda: agent.reconnects,
                        leases=lambda: len(state.claims),
                    ),
                    getattr(runtime, "nvml", None),
                    getattr(runtime, "health", None),
                ),
                token=metrics.read_token(metrics_token_file, os.environ),
            )
        except (metrics.MetricsSetupError, OSError) as exc:
            print(f"cloudgpu-agent: cannot serve metrics: {exc}", file=sys.stderr)
            return EXIT_USAGE if isinstance(exc, metrics.MetricsSetupError) else EXIT_ERROR

    snapshots = profiling.start()
    signalled: list[int] = []

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        profiling.on_sigusr2(loop, snapshots)

        def on_signal(signum: int) -> None:
            signalled.append(signum)  # a stop asked for wins over a pending re-exec
            if stop.is_set():
                logging.getLogger("cloudgpu.agent").error("second signal: exiting now")
                os._exit(EXIT_ERROR)
            logging.getLogger("cloudgpu.agent").info(
                "%s: shutting down (containers keep running)", signal.Signals(signum).name
            )
            stop.set()

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, on_signal, signum)
        trimming = asyncio.create_task(native_memory.trim_periodically(stop))
        try:
            await agent.run(stop)
        finally:
            stop.set()
            await trimming

    logging.getLogger("cloudgpu.agent").info(
        "cloudgpu-agent %s starting (runtime %s, hub %s, agent id %s)",
        __version__,
        config.runtime,
        config.ws_url,
        state.agent_id,
    )
    try:
        asyncio.run(main())
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
    if agent.reexec_argv and not signalled:
        # A rollout switched the prefix without systemd to restart us (self_upgrade.py): the
        # state lock and claims' fds are not inherited, the new version takes them again.
        logging.getLogger("cloudgpu.agent").info("exec %s", " ".join(agent.reexec_argv))
        logging.shutdown()
        os.execv(agent.reexec_argv[0], agent.reexec_argv)  # noqa: S606
    return EXIT_OK


def cmd_service(args: argparse.Namespace) -> int:
    from pathlib import Path

    from supplier_agent.service import ServiceError, install_service, uninstall_service

    unit_dir = Path(args.unit_dir) if args.unit_dir else None
    try:
        if args.command == "uninstall-service":
            return uninstall_service(unit_dir, no_systemd=args.no_systemd)
        state = args.state or os.environ.get("CLOUDGPU_STATE_DIR") or default_state_dir()
        return install_service(Path(args.prefix), Path(state), unit_dir, no_systemd=args.no_systemd)
    except ServiceError as exc:
        print(f"cloudgpu-agent: {exc}", file=sys.stderr)
        return EXIT_ERROR


def cmd_upgrade(args: argparse.Namespace) -> int:
    from pathlib import Path

    from supplier_agent.config import CONFIG_NAME
    from supplier_agent.upgrade import UpgradeError, release_url_for, upgrade

    flags = _flags(args)
    prefix_state = Path(args.prefix) / "state"
    # The installer keeps the state under the prefix: `upgrade --prefix P` finds it there.
    explicit = flags["state"] or os.environ.get("CLOUDGPU_STATE_DIR")
    if not explicit and (prefix_state / CONFIG_NAME).exists():
        flags["state"] = str(prefix_state)
    config = load(flags)
    try:
        return upgrade(
            Path(args.prefix),
            config.state_dir,
            args.release_url or release_url_for(config.hub_url),
            no_systemd=args.no_systemd,
            force=args.force,
            allow_downgrade=args.allow_downgrade,
            deadline_s=args.timeout,
            health_window_s=args.health_window,
            release_keys=config.release_keys,
            expect_version=args.expect_version,
        )
    except (UpgradeError, OSError) as exc:
        print(f"cloudgpu-agent upgrade: {exc}", file=sys.stderr)
        return EXIT_ERROR


def make_runtime(config: AgentConfig, agent_id: str) -> Runtime:
    if config.runtime == "mock":
        from supplier_agent.mock_runtime import MockRuntime

        return MockRuntime(agent_id)
    from supplier_agent.docker_runtime import DockerRuntime

    return DockerRuntime(config, agent_id)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "version":
        print(f"cloudgpu-agent {__version__} (Python {platform.python_version()})")
        return EXIT_OK
    if args.command == "bench":
        return cmd_bench(args)
    try:
        if args.command == "configure":
            return cmd_configure(args)
        if args.command == "doctor":
            from supplier_agent.doctor import run_doctor

            return run_doctor(args.state, connectivity=args.connectivity)
        if args.command in ("install-service", "uninstall-service"):
            return cmd_service(args)
        if args.command == "upgrade":
            return cmd_upgrade(args)
        config = load(_flags(args))
        if args.command == "smoke":
            from supplier_agent.smoke import run_smoke

            return run_smoke(config)
        return cmd_run(
            config,
            getattr(args, "metrics", None),
            getattr(args, "metrics_token_file", None),
            trial_s=getattr(args, "trial", None),
        )
    except (ConfigError, StateInUse) as exc:
        print(f"cloudgpu-agent: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
