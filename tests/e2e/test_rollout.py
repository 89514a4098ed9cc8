"""Issue 37 end to end: staged rollouts over 20 real agents (mock runtime), each installed the
way install.sh does it (``<prefix>/venv`` a link to the installed version), on a real hub (web,
worker, beat) that serves a signed release folder.

A release that registers and then sends no heartbeat is stopped after its first wave: the
rollout pauses by itself, says why, and the wave's two agents roll back to the version they
ran, while the other 18 never hear of it. A good release then reaches every host, wave by wave;
a host that is off while it runs is listed as left behind and joins when it starts again.

Each agent really upgrades: a virtualenv of its own, pip from a local wheelhouse, smoke, a
trial run, the switch, and an exec of the new version (no systemd here).
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.test import Client, override_settings

from hub.rollouts import services
from hub.rollouts.models import Rollout, RolloutHost
from hub.suppliers.models import Host
from supplier_agent import __version__, release_signing
from tests.hub import factories as f
from tests.support.agent_wheels import (
    Wheel,
    build_wheel,
    download_wheelhouse,
    install_venv,
    pip_env,
)
from tests.support.agents import configure
from tests.support.hub_stack import hub_stack
from tests.support.polling import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

AGENTS = 20
BAD = "99.0.1"
GOOD = "99.0.2"
STATE = RolloutHost.State
# Settings of the hub under test: a tick a second; an upgraded host is watched 8 s, long
# enough for the offline sweep (3 s without a heartbeat) to see a silent one.
HUB = {
    "ROLLOUT_TICK_S": "1",
    "ROLLOUT_OBSERVE_S": "8",
    "ROLLOUT_HOST_TIMEOUT_S": "300",
    "ROLLOUT_MAX_FAILURE_PERCENT": "10",
}


def _silent(package: Path) -> None:
    """The bad release: everything works (smoke, trial, registration) but heartbeats."""
    agent = package / "agent.py"
    head = "    async def _heartbeat_loop(self, ws: ClientConnection) -> None:\n"
    text = agent.read_text()
    assert head in text
    agent.write_text(text.replace(head, head + "        await asyncio.Event().wait()\n"))


def _publish(folder: Path, wheel: Wheel, key: Ed25519PrivateKey) -> None:
    """A signed release folder, as `python -m supplier_agent.release_signing sign` makes one."""
    for old in folder.glob("*.whl"):
        old.unlink()
    (folder / wheel.path.name).write_bytes(wheel.path.read_bytes())
    signature = release_signing.sign(key, wheel.version, wheel.path.name, wheel.sha256, [])
    release = {
        "version": wheel.version,
        "filename": wheel.path.name,
        "sha256": wheel.sha256,
        "next_keys": [],
        "signatures": [signature],
    }
    (folder / "release.json").write_text(json.dumps(release))


@dataclass
class Site:
    prefix: Path
    state: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def agent(self) -> Path:
        return self.prefix / "venv" / "bin" / "cloudgpu-agent"

    def start(self, env: dict[str, str]) -> None:
        with open(self.log, "ab") as out:
            # As the unit's ExecStart: through the link, so the agent knows its prefix.
            self.process = subprocess.Popen(
                [str(self.agent), "run", "--state", str(self.state)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextmanager
def _running(sites: list[Site], env: dict[str, str]) -> Iterator[None]:
    with ExitStack() as stack:
        for site in sites:
            stack.callback(site.stop)
            site.start(env)
        yield


def _host(site: Site) -> Host:
    agent_id = (site.state / "agent_id").read_text().strip()
    return Host.objects.get(agent_id=agent_id)


def _versions(sites: list[Site]) -> list[str]:
    return [_host(s).agent_version for s in sites]


def _logs(sites: list[Site]) -> str:
    return "\n".join(f"--- {s.log}\n{s.log.read_text(errors='replace')[-3000:]}" for s in sites)


def test_a_bad_release_stops_after_its_first_wave_and_a_good_one_reaches_every_host(
    tmp_path: Path,
) -> None:
    wheelhouse = download_wheelhouse(tmp_path / "wheelhouse")
    wheels = tmp_path / "wheels"
    current = build_wheel(tmp_path, wheels, __version__)
    bad = build_wheel(tmp_path, wheels, BAD, edit=_silent)
    good = build_wheel(tmp_path, wheels, GOOD)
    # One installed copy of the running version, the target of every prefix's link (as in
    # tests/agent/test_upgrade.py): an upgrade builds venvs/<version> under its own prefix.
    installed = install_venv(tmp_path / "installed" / __version__, current, wheelhouse)
    key = Ed25519PrivateKey.generate()
    release_dir = tmp_path / "release"
    release_dir.mkdir()
    _publish(release_dir, bad, key)
    pinned = release_signing.public_key_text(key.public_key())
    # pip without .pyc compilation: twenty installs on two cores; nothing tested needs them.
    # (pip reads its "no-" options' variables inverted: PIP_NO_COMPILE=0 is --no-compile.)
    env = pip_env(wheelhouse, PIP_NO_COMPILE="0", CLOUDGPU_ROLLOUT_HEALTH_WINDOW_S="2")

    sites = []
    for n in range(AGENTS):
        prefix = tmp_path / f"host{n}" / "opt"
        prefix.mkdir(parents=True)
        (prefix / "venv").symlink_to(installed)
        sites.append(Site(prefix, tmp_path / f"host{n}" / "state", tmp_path / f"agent{n}.log"))

    (tmp_path / "hub").mkdir()
    with (
        hub_stack(tmp_path / "hub", public=True, AGENT_RELEASE_DIR=str(release_dir), **HUB) as hub,
        override_settings(AGENT_RELEASE_DIR=str(release_dir)),
    ):
        for site in sites:
            _, token = f.make_token()
            done = configure(
                site.state, hub.url(), token, "--runtime", "mock", "--release-key", pinned
            )
            assert done.returncode == 0, done.stderr
        with _running(sites, env):
            wait_for(
                lambda: Host.objects.filter(
                    status=Host.Status.ONLINE, agent_version=__version__
                ).count()
                == AGENTS,
                timeout_s=120,
                what="twenty agents online",
            )

            # --- the bad release: stopped after its first wave, which rolls back -----------
            first = services.create([10, 100], pause_s=0)
            wave1 = [s for s in sites if _row(first, s).wave == 1]
            assert len(wave1) == 2
            paused = wait_for(
                lambda: Rollout.objects.filter(pk=first.pk, state="paused").first(),
                timeout_s=300,
                what=f"the rollout of {BAD} to pause itself\n{_logs(wave1)}",
            )
            assert "lost its heartbeats" in paused.reason
            # The agents say they rolled back, then register again at the version they ran.
            wait_for(
                lambda: all(_row(first, s).state == STATE.ROLLED_BACK for s in wave1)
                and _versions(wave1) == [__version__] * 2,
                timeout_s=180,
                what=f"wave 1 to roll back\n{_logs(wave1)}",
            )
            for site in wave1:
                assert (site.prefix / "venv").resolve() == installed.resolve()
                assert f"rollout {first.pk}: rolled back to {__version__}" in site.log.read_text()
            rest = [s for s in sites if s not in wave1]
            assert {_row(first, s).state for s in rest} == {STATE.PENDING}
            assert set(_versions(rest)) == {__version__}
            # Never told: nothing was even downloaded on the other 18.
            assert not any((s.prefix / "venvs").exists() for s in rest)
            services.abort(first.pk)

            # --- the good release: every host, one of them late ----------------------------
            _publish(release_dir, good, key)
            late = rest[-1]
            late.stop()
            wait_for(
                lambda: _host(late).status == Host.Status.OFFLINE,
                timeout_s=60,
                what="the stopped agent's host offline",
            )
            second = services.create([10, 100], pause_s=0)
            wait_for(
                lambda: Rollout.objects.filter(pk=second.pk, state="done").exists(),
                timeout_s=600,
                what=f"the rollout of {GOOD} to finish\n{_logs(sites[:3])}",
            )
            online = [s for s in sites if s is not late]
            assert set(_versions(online)) == {GOOD}
            assert {_row(second, s).state for s in online} == {STATE.UPGRADED}
            assert _row(second, late).state == STATE.PENDING
            page = _fleet_page()
            assert "left behind (offline)" in page
            assert f"{AGENTS - 1} of {AGENTS} hosts upgraded" in page
            # It comes back: it joins the finished rollout.
            late.start(env)
            wait_for(
                lambda: _row(second, late).state == STATE.UPGRADED,
                timeout_s=300,
                what=f"the late host to upgrade\n{_logs([late])}",
            )
            assert _host(late).agent_version == GOOD
            for site in sites:
                assert (site.prefix / "venv").resolve().name == GOOD
                assert site.process is not None
                assert site.process.poll() is None, _logs([site])


def _row(rollout: Rollout, site: Site) -> RolloutHost:
    return RolloutHost.objects.get(rollout=rollout, host=_host(site))


def _fleet_page() -> str:
    client = Client()
    client.force_login(f.make_user("admin", is_staff=True))
    return client.get("/admin/fleet/").content.decode()
