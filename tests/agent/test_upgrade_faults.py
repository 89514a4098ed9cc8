"""`cloudgpu-agent upgrade` when things go wrong on the supplier's side (issue 22): a hub that
trickles or cuts the download, a release that dies in ``run``, an older release, a hub that
serves no release, and the service commands under ``--no-systemd``.

The installed agent upgrades itself through its real CLI, against loopback servers this module
runs; the fixtures (wheels, wheelhouse, a prefix) are ``test_upgrade.py``'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from supplier_agent import __version__
from supplier_agent.protocol import Upgrade
from supplier_agent.upgrade import ROLLBACK_RECORD
from tests.agent import test_upgrade
from tests.agent.test_upgrade import Build, Site, Wheel, _build_wheel, _run
from tests.support.agents import AGENT, agent_env

# Virtualenvs, pip and real agents: seconds each, out of the fast lane (tests/conftest.py).
pytestmark = pytest.mark.slow

# The same fixtures: wheels and a wheelhouse built once per module, a prefix per test.
build = test_upgrade.build
site = test_upgrade.site

DIES_IN_RUN_VERSION = "99.0.2"
NO_TRIAL_VERSION = "99.0.3"
OLDER_VERSION = "0.0.1"
STALL_AFTER_S = 3.5


class FaultServer:
    """A release description plus a wheel served badly on purpose, on loopback.

    ``mode``: ``trickle`` (one byte at a time, forever), ``short`` (Content-Length promises
    more than comes), ``chunked-cut`` (a chunked body that stops mid-chunk), ``missing`` (404
    for everything), ``silent`` (headers, then nothing), ``stall`` (a trickle for
    STALL_AFTER_S, then nothing)."""

    def __init__(self, mode: str, version: str = "99.9.9") -> None:
        self.mode = mode
        self.version = version
        self.stop = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if server.mode == "missing":
                    self.send_error(404)
                elif self.path == "/release.json":
                    body = json.dumps(server.release).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    server.send_wheel(self)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True  # the trickle never ends by itself
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def release(self) -> dict[str, str]:
        name = f"cloudgpu_agent-{self.version}-py3-none-any.whl"
        return {
            "version": self.version,
            "filename": name,
            "sha256": hashlib.sha256(b"x" * 4096).hexdigest(),
            "url": f"{self.url}/{name}",
        }

    def send_wheel(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        try:
            handler.send_response(200)
            if self.mode == "chunked-cut":
                handler.send_header("Transfer-Encoding", "chunked")
                handler.end_headers()
                handler.wfile.write(b"1000\r\n" + b"x" * 100)  # promises 4096, sends 100
            else:
                handler.send_header("Content-Length", "4096")
                handler.end_headers()
                if self.mode == "short":
                    handler.wfile.write(b"x" * 1000)
                elif self.mode == "silent":
                    handler.wfile.flush()
                    self.stop.wait()
                else:  # trickle: a byte every 50 ms until the client goes away (or the stall)
                    stall_at = time.monotonic() + STALL_AFTER_S
                    while not self.stop.wait(0.05):
                        if self.mode == "stall" and time.monotonic() > stall_at:
                            self.stop.wait()
                            break
                        handler.wfile.write(b"x")
                        handler.wfile.flush()
            handler.wfile.flush()
            handler.close_connection = True
        except OSError:
            pass  # the client gave up, as it should

    def __enter__(self) -> FaultServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._server.shutdown()
        self._server.server_close()


def _unchanged(site: Site, build: Build) -> None:
    assert os.readlink(site.link) == str(build.old_venv)
    assert not (site.prefix / "venvs").exists() or not list((site.prefix / "venvs").iterdir())
    assert site.agent("version").stdout.startswith(f"cloudgpu-agent {__version__} ")


def _one_clear_line(stderr: str) -> None:
    assert "Traceback" not in stderr
    assert stderr.startswith("cloudgpu-agent upgrade: ")


# --- 5: one overall deadline; a cut download says so -------------------------------------------


def test_a_trickling_download_stops_at_the_overall_deadline(site: Site, build: Build) -> None:
    with FaultServer("trickle") as server:
        result = site.upgrade(f"{server.url}/release.json", "--timeout", "3")

    assert result.returncode == 1
    _one_clear_line(result.stderr)
    assert "timed out: the upgrade ran past its 3 s budget" in result.stderr
    assert "downloading the wheel" in result.stderr
    _unchanged(site, build)


@pytest.mark.parametrize("mode", ["short", "chunked-cut"])
def test_a_download_cut_short_says_incomplete_not_mismatch(
    site: Site, build: Build, mode: str
) -> None:
    with FaultServer(mode) as server:
        result = site.upgrade(f"{server.url}/release.json")

    assert result.returncode == 1
    _one_clear_line(result.stderr)
    assert "incomplete download" in result.stderr
    assert "sha256" not in result.stderr
    _unchanged(site, build)


# --- issue 34, 6: a read waits no longer than the budget left, and says the limit it had -------


@pytest.mark.parametrize("mode", ["silent", "stall"])
def test_a_download_that_goes_silent_stops_at_the_budget_and_says_its_real_limit(
    site: Site, build: Build, mode: str
) -> None:
    budget_s = 6
    with FaultServer(mode) as server:
        started = time.monotonic()
        result = site.upgrade(f"{server.url}/release.json", "--timeout", str(budget_s))
        elapsed = time.monotonic() - started

    assert result.returncode == 1
    _one_clear_line(result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"ran past its {budget_s} s budget downloading the wheel" in result.stderr
    assert "sent nothing for" in result.stderr
    # It said "sent nothing for 30 s" whatever --timeout was.
    assert "30 s" not in result.stderr
    # Each read waits at most what is left: a stall after a trickle used to wait out the timeout
    # the socket got at the open (nearly the whole budget) on top of the trickle.
    assert elapsed < budget_s + 2.5, f"{elapsed:.1f} s"
    _unchanged(site, build)


# --- 10: a hub that serves no release ----------------------------------------------------------


def test_a_hub_answering_404_was_reached_but_serves_no_release(site: Site, build: Build) -> None:
    with FaultServer("missing") as server:
        result = site.upgrade(f"{server.url}/agent/release.json")

    assert result.returncode == 1
    _one_clear_line(result.stderr)
    assert "was reached, but it serves no agent release" in result.stderr
    assert "cannot reach" not in result.stderr
    _unchanged(site, build)


# --- 8: downgrades -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def older(tmp_path_factory: pytest.TempPathFactory) -> Wheel:
    work = tmp_path_factory.mktemp("older")
    return _build_wheel(work, work / "wheels", OLDER_VERSION)


def test_a_downgrade_is_refused_unless_allowed(site: Site, build: Build, older: Wheel) -> None:
    url = site.releases.publish(older)

    refused = site.upgrade(url)
    assert refused.returncode == 1
    _one_clear_line(refused.stderr)
    assert f"older than the running {__version__}" in refused.stderr
    assert "--allow-downgrade" in refused.stderr
    _unchanged(site, build)

    allowed = site.upgrade(url, "--allow-downgrade")
    assert allowed.returncode == 0, allowed.stderr
    assert os.readlink(site.link) == f"venvs/{OLDER_VERSION}"


# --- 4: a version that dies in `run` is rolled back after the restart --------------------------

# Stands in for systemctl on PATH: `restart` runs the agent the way a unit would (stopping the
# previous one first, as systemd does), `show` reports it; a real process either way.
FAKE_SYSTEMCTL = r"""#!/bin/bash
d=$FAKE_SYSTEMD_DIR
alive() { [[ -n $1 && -e /proc/$1 ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status"; }
case $1 in
  restart)
    old=$(cat "$d/pid" 2>/dev/null || true)
    if alive "$old"; then
      kill "$old"
      for _ in $(seq 300); do alive "$old" || break; sleep 0.1; done
    fi
    echo restart >>"$d/calls"
    setsid "$FAKE_SYSTEMD_PREFIX/venv/bin/cloudgpu-agent" run --state "$FAKE_SYSTEMD_STATE" \
      </dev/null >>"$d/agent.log" 2>&1 &
    echo $! >"$d/pid"
    ;;
  show)
    echo "LoadState=${FAKE_SYSTEMD_LOADSTATE:-loaded}"
    pid=$(cat "$d/pid" 2>/dev/null || true)
    if alive "$pid"; then printf 'ActiveState=active\nMainPID=%s\n' "$pid"
    else printf 'ActiveState=failed\nMainPID=0\n'; fi
    echo NRestarts=0
    ;;
  *) exit 1 ;;
esac
"""


def _rebuild(work: Path, version: str, edit: Callable[[str], str]) -> Wheel:
    """The agent wheel of ``version`` with its cli.py changed by ``edit``."""
    _build_wheel(work, work / "first", version)  # leaves its source in src-<version>
    source = work / f"src-{version}"
    cli = source / "supplier_agent" / "cli.py"
    cli.write_text(edit(cli.read_text()))
    out = work / "wheels"
    _run(
        [
            *(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"),
            *("-w", str(out), str(source)),
        ]
    )
    (path,) = out.iterdir()
    return Wheel(path, version)


@pytest.fixture(scope="module")
def dies_in_run(tmp_path_factory: pytest.TempPathFactory) -> Wheel:
    """Installs, reports its version, passes `smoke`, then exits as soon as `run` starts."""

    def edit(text: str) -> str:
        # The first line of cmd_run's body, whatever its parameters: the version dies on `run`.
        head = re.search(r"^def cmd_run\(.*?\) -> int:\n", text, flags=re.M | re.S)
        assert head is not None
        return text.replace(
            head.group(0), head.group(0) + '    raise SystemExit("deliberately dies in run")\n'
        )

    return _rebuild(tmp_path_factory.mktemp("dies-in-run"), DIES_IN_RUN_VERSION, edit)


@pytest.fixture(scope="module")
def no_trial(tmp_path_factory: pytest.TempPathFactory) -> Wheel:
    """A version from before `run --trial` (what --allow-downgrade may install): `run` has no
    such option, so argparse refuses it with exit 2."""

    def edit(text: str) -> str:
        assert '"--trial",' in text
        # Not "--trial-something": argparse takes a prefix of an option for the option.
        return text.replace('"--trial",', '"--try-out",', 1)

    return _rebuild(tmp_path_factory.mktemp("no-trial"), NO_TRIAL_VERSION, edit)


@pytest.fixture
def fake_systemd(site: Site, tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "fake-systemd"
    (folder / "bin").mkdir(parents=True)
    shim = folder / "bin" / "systemctl"
    shim.write_text(FAKE_SYSTEMCTL)
    shim.chmod(0o755)
    site.env.update(
        PATH=f"{folder / 'bin'}{os.pathsep}{site.env['PATH']}",
        FAKE_SYSTEMD_DIR=str(folder),
        FAKE_SYSTEMD_PREFIX=str(site.prefix),
        FAKE_SYSTEMD_STATE=str(site.state),
    )
    try:
        yield folder
    finally:
        pid_file = folder / "pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def _with_systemd(site: Site, *argv: str, running: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a mount namespace of its own where systemd is running (an empty
    /run/systemd/system exists, as sd_booted(3) asks) or is not (no such folder), whatever the
    machine running the tests has; the fake_systemd fixture stands in for systemctl."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    script = (
        "if [ -d /run/systemd ]; then m=/run/systemd; else m=/run; fi; "
        "mount -t tmpfs cloudgpu-test $m || exit 99; "
        'if [ "$1" = yes ]; then mkdir -p /run/systemd/system || exit 99; fi; shift; exec "$@"'
    )
    result = subprocess.run(
        [
            *("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"),
            *("yes" if running else "no", *argv),
        ],
        capture_output=True,
        text=True,
        env=site.env,
        timeout=600,
        check=False,
    )
    if result.returncode == 99:
        pytest.skip(f"cannot mount a private /run/systemd: {result.stderr}")
    return result


def _upgrade_argv(site: Site, url: str, *extra: str) -> list[str]:
    # Without --no-systemd, unlike Site.upgrade.
    return [
        str(site.link / "bin" / "cloudgpu-agent"),
        *("upgrade", "--prefix", str(site.prefix), "--state", str(site.state)),
        *("--release-url", url, *extra),
    ]


def test_a_version_that_dies_in_run_is_rolled_back_after_the_restart(
    site: Site, build: Build, dies_in_run: Wheel, fake_systemd: Path
) -> None:
    url = site.releases.publish(dies_in_run)
    result = _with_systemd(site, *_upgrade_argv(site, url, "--health-window", "3"))

    assert result.returncode == 1, result.stdout
    assert f"version {DIES_IN_RUN_VERSION} did not stay up" in result.stderr
    assert "rolled back" in result.stderr
    assert "Traceback" not in result.stderr
    assert os.readlink(site.link) == str(build.old_venv)
    assert not (site.prefix / "venvs" / DIES_IN_RUN_VERSION).exists()
    assert (fake_systemd / "calls").read_text().split() == ["restart", "restart"]

    # The old version runs again and reaches the hub.
    def registered() -> list[object]:
        return [
            m
            for c in site.hub.connections
            for m in c.received
            if getattr(m, "TYPE", "") == "register" and not m.probe
        ]

    registers = site.hub.wait(registered, what="the old version registering")
    assert {m.agent_version for m in registers} == {__version__}


# --- issue 37: a hub rollout's upgrade under systemd outlives the agent that started it --------


def test_a_rollout_s_upgrade_under_systemd_restarts_the_unit_and_finishes_its_watch(
    site: Site, build: Build, fake_systemd: Path
) -> None:
    """The agent runs "under systemd" (INVOCATION_ID set; the fake systemctl is its unit).
    Told to upgrade over its socket, it starts `cloudgpu-agent upgrade`, whose restart stops
    the agent; the upgrade must live on through that, watch the new version's health window and
    finish. (Started as an asyncio subprocess it was killed at the old agent's loop close on
    Pythons with a pidfd child watcher, 3.12 on; on this suite's 3.11 that way passes too, so
    this guards the systemd path as a whole, and self_upgrade.py says why it uses Popen.)"""
    site.releases.publish(build.good)
    site.hub.release_json = (site.releases.root / "release.json").read_text()
    site.env["INVOCATION_ID"] = "fake-unit-invocation"
    site.env["CLOUDGPU_ROLLOUT_HEALTH_WINDOW_S"] = "2"
    # The unit's first start, in a namespace where systemd "runs": the agent and whatever it
    # starts stay in it after this returns.
    started = _with_systemd(site, "systemctl", "restart")
    assert started.returncode == 0, started.stderr
    first = site.hub.wait_for_connection()
    site.hub.wait_for(first, "register", lambda m: not m.probe, timeout_s=60)
    rollout = "6f1c1c3e-1b1a-4f0e-9a51-2c3c1c1c1c1c"
    site.hub.send(first, Upgrade(rollout_id=rollout, version=test_upgrade.GOOD_VERSION))
    site.hub.wait_for(first, "upgrade_status", lambda m: m.state == "started")

    def new_version_registered() -> object:
        return next(
            (
                m
                for c in site.hub.connections
                for m in c.received
                if getattr(m, "TYPE", "") == "register"
                and not m.probe
                and m.agent_version == test_upgrade.GOOD_VERSION
            ),
            None,
        )

    site.hub.wait(new_version_registered, timeout_s=300, what="the new version registering")
    log = site.state / "upgrade.log"
    site.hub.wait(
        lambda: "upgrade: done" in log.read_text(), timeout_s=120, what="the upgrade's end"
    )
    assert "watching it for 2 s" in log.read_text()
    assert os.readlink(site.link) == f"venvs/{test_upgrade.GOOD_VERSION}"
    assert (fake_systemd / "calls").read_text().split() == ["restart", "restart"]
    record = json.loads((site.prefix / ROLLBACK_RECORD).read_text())
    assert record == {"version": __version__, "path": str(build.old_venv)}


# --- issue 34, 4: --no-systemd tries `run` before the switch; no systemd is refused up front ----


def test_with_no_systemd_a_version_that_dies_in_run_fails_its_trial_and_is_not_switched(
    site: Site, build: Build, dies_in_run: Wheel
) -> None:
    result = site.upgrade(site.releases.publish(dies_in_run))

    # It used to switch to it and report success: its smoke passes, only `run` dies.
    assert result.returncode == 1, result.stdout
    assert "Traceback" not in result.stderr
    assert f"version {DIES_IN_RUN_VERSION} failed its " in result.stderr
    assert "trial run (`run --trial`): deliberately dies in run" in result.stderr
    assert f"rolled back: removed {site.prefix / 'venvs' / DIES_IN_RUN_VERSION}" in result.stderr
    assert f"still runs {__version__}" in result.stderr
    _unchanged(site, build)


def test_with_no_systemd_a_version_without_run_trial_is_switched_untried(
    site: Site, build: Build, no_trial: Wheel
) -> None:
    result = site.upgrade(site.releases.publish(no_trial))

    assert result.returncode == 0, result.stderr
    assert f"version {NO_TRIAL_VERSION} has no `run --trial`; switching untried" in result.stdout
    assert os.readlink(site.link) == f"venvs/{NO_TRIAL_VERSION}"


def test_without_no_systemd_a_host_without_systemd_is_refused_before_any_download(
    site: Site, build: Build
) -> None:
    url = site.releases.publish(build.good)
    result = _with_systemd(site, *_upgrade_argv(site, url), running=False)

    # It used to download, build and smoke-test, then fail with "did not stay up".
    assert result.returncode == 1, result.stdout
    _one_clear_line(result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "systemd is not running on this host" in result.stderr
    assert "nothing was changed" in result.stderr
    assert "Rerun with --no-systemd" in result.stderr
    assert "reading" not in result.stdout  # not even the release description
    assert site.hub.connections == []  # no smoke
    _unchanged(site, build)


def test_without_no_systemd_a_missing_unit_is_refused_before_any_download(
    site: Site, build: Build, fake_systemd: Path
) -> None:
    site.env["FAKE_SYSTEMD_LOADSTATE"] = "not-found"
    url = site.releases.publish(build.good)
    result = _with_systemd(site, *_upgrade_argv(site, url))

    assert result.returncode == 1, result.stdout
    _one_clear_line(result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "the cloudgpu-agent.service unit is not installed" in result.stderr
    assert "LoadState=not-found" in result.stderr
    assert "Rerun with --no-systemd" in result.stderr
    assert "reading" not in result.stdout
    assert not (fake_systemd / "calls").exists()  # never restarted
    _unchanged(site, build)


# --- 9: --no-systemd touches nothing under /etc; upgrade finds its state from the prefix -------


def _in_private_etc(tmp_path: Path, *argv: str, setup: str = ":") -> tuple[int, list[str]]:
    """Run ``argv`` with a private, empty /etc/systemd/system (a tmpfs in a mount namespace of
    its own, gone with it); return its exit status and what that folder held afterwards."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    listing = tmp_path / "etc-listing"
    script = (
        "mount -t tmpfs cloudgpu-test /etc/systemd/system || exit 99; cd /etc/systemd/system; "
        f'{setup}; "$@" >&2; rc=$?; ls -A /etc/systemd/system >"{listing}"; exit $rc'
    )
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv],
        capture_output=True,
        text=True,
        env=agent_env(),
        timeout=60,
        check=False,
    )
    if result.returncode == 99:
        pytest.skip(f"cannot mount a private /etc/systemd/system: {result.stderr}")
    return result.returncode, listing.read_text().split()


def test_install_service_with_no_systemd_writes_nothing_under_etc(tmp_path: Path) -> None:
    prefix = tmp_path / "opt"
    rc, listing = _in_private_etc(
        tmp_path,
        *(AGENT, "install-service", "--no-systemd"),
        *("--prefix", str(prefix), "--state", str(tmp_path / "state")),
    )
    assert rc == 0
    assert listing == []


def test_uninstall_service_with_no_systemd_removes_nothing_under_etc(tmp_path: Path) -> None:
    rc, listing = _in_private_etc(
        tmp_path,
        *(AGENT, "uninstall-service", "--no-systemd"),
        setup="echo '[Unit]' >cloudgpu-agent.service",
    )
    assert rc == 0
    assert listing == ["cloudgpu-agent.service"]


def test_upgrade_with_only_a_prefix_finds_the_state_under_it(
    site: Site, build: Build, tmp_path: Path
) -> None:
    # The installer's layout: the config in PREFIX/state.
    shutil.copytree(site.state, site.prefix / "state")
    shutil.rmtree(site.state)
    url = site.releases.publish(build.current)
    result = subprocess.run(
        [
            *(str(site.link / "bin" / "cloudgpu-agent"), "upgrade", "--prefix", str(site.prefix)),
            *("--no-systemd", "--release-url", url),
        ],
        capture_output=True,
        text=True,
        env=site.env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"already at version {__version__}" in result.stdout
