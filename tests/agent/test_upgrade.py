"""`cloudgpu-agent upgrade` with real wheels built from this repository, real virtualenvs, a
release description served on loopback and a protocol peer answering the new version's smoke.

Dependencies come from a wheelhouse downloaded once per module (``pip download``), handed to
the upgrade's pip through pip's own environment (``PIP_FIND_LINKS``, ``PIP_NO_INDEX``).
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from supplier_agent import __version__, release_signing
from supplier_agent.config import read_file
from tests.support.agent_wheels import (
    PIP_TIMEOUT_S,
    Wheel,
    build_wheel,
    download_wheelhouse,
    install_venv,
    pip_env,
)
from tests.support.agent_wheels import run as _run
from tests.support.agents import configure, new_token, running_agent
from tests.support.hub_peer import HubPeer

GOOD_VERSION = "99.0.0"
BROKEN_VERSION = "99.0.1"
TRIAL_WINDOW_S = 2  # `upgrade --no-systemd --health-window`: the new version's `run --trial`


@dataclass(frozen=True)
class Build:
    wheelhouse: Path  # the agent's runtime dependencies, for an offline pip
    current: Wheel
    good: Wheel
    broken: Wheel  # installs and says its version, but `smoke` dies at import
    old_venv: Path  # the current version, installed, shared by every test's prefix


def _build_wheel(work: Path, out: Path, version: str, *, break_smoke: bool = False) -> Wheel:
    def broken_smoke(package: Path) -> None:
        smoke = package / "smoke.py"
        smoke.write_text(smoke.read_text() + '\nraise RuntimeError("deliberately broken")\n')

    return build_wheel(work, out, version, edit=broken_smoke if break_smoke else None)


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    work = tmp_path_factory.mktemp("upgrade-build")
    wheelhouse = download_wheelhouse(work / "wheelhouse")
    wheels = work / "wheels"
    current = _build_wheel(work, wheels, __version__)
    old_venv = install_venv(work / "venvs" / __version__, current, wheelhouse)
    return Build(
        wheelhouse=wheelhouse,
        current=current,
        good=_build_wheel(work, wheels, GOOD_VERSION),
        broken=_build_wheel(work, wheels, BROKEN_VERSION, break_smoke=True),
        old_venv=old_venv,
    )


class ReleaseServer:
    """Serves a folder over loopback HTTP, like the hub's /agent/release.json and wheel URL."""

    def __init__(self, root: Path) -> None:
        handler = functools.partial(_QuietHandler, directory=str(root))
        self.root = root
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> ReleaseServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def publish(
        self,
        wheel: Wheel,
        *,
        data: bytes | None = None,
        sha256: str = "",
        signed_by: Ed25519PrivateKey | None = None,
        next_keys: tuple[str, ...] = (),
    ) -> str:
        (self.root / "wheels").mkdir(exist_ok=True)
        (self.root / "wheels" / wheel.path.name).write_bytes(data or wheel.path.read_bytes())
        release: dict[str, Any] = {
            "version": wheel.version,
            "filename": wheel.path.name,
            "sha256": sha256 or wheel.sha256,
            "url": f"{self.url}/wheels/{wheel.path.name}",
        }
        if signed_by is not None:
            # Signed for the wheel as built, whatever ``sha256`` the description then claims.
            signature = release_signing.sign(
                signed_by, wheel.version, wheel.path.name, wheel.sha256, next_keys
            )
            release |= {"next_keys": list(next_keys), "signatures": [signature]}
        (self.root / "release.json").write_text(json.dumps(release))
        return f"{self.url}/release.json"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class Site:
    prefix: Path
    state: Path
    hub: HubPeer
    releases: ReleaseServer
    env: dict[str, str]

    @property
    def link(self) -> Path:
        return self.prefix / "venv"

    def upgrade(self, release_url: str, *extra: str) -> subprocess.CompletedProcess[str]:
        # The installed agent upgrades itself, as on a supplier's host.
        return subprocess.run(
            [
                str(self.link / "bin" / "cloudgpu-agent"),
                "upgrade",
                "--prefix",
                str(self.prefix),
                "--state",
                str(self.state),
                "--no-systemd",
                "--release-url",
                release_url,
                # The trial run before the switch lasts the health window: 30 s by default.
                *("--health-window", str(TRIAL_WINDOW_S)),
                *extra,
            ],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=PIP_TIMEOUT_S,
            check=False,
        )

    def agent(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.link / "bin" / "cloudgpu-agent"), *args],
            capture_output=True,
            text=True,
            env=self.env,
            input="",
            timeout=60,
            check=False,
        )

    def pin(self, *keys: Ed25519PrivateKey) -> None:
        """Pin keys as install.sh does: `configure --update --release-key`."""
        flags = [a for k in keys for a in ("--release-key", _public(k))]
        result = self.agent("configure", "--update", "--state", str(self.state), *flags)
        assert result.returncode == 0, result.stderr


def _public(key: Ed25519PrivateKey) -> str:
    return release_signing.public_key_text(key.public_key())


@pytest.fixture
def site(tmp_path: Path, build: Build) -> Iterator[Site]:
    """An installation whose `venv` symlink points at the current version, configured for a
    loopback hub peer in mock runtime."""
    prefix = tmp_path / "opt"
    prefix.mkdir()
    # Absolute, outside <prefix>/venvs: the upgrade must never delete what it did not create.
    (prefix / "venv").symlink_to(build.old_venv)
    token = new_token()
    state = tmp_path / "state"
    (tmp_path / "www").mkdir()
    with HubPeer(token) as hub, ReleaseServer(tmp_path / "www") as releases:
        assert configure(state, hub.url, token, "--runtime", "mock").returncode == 0
        yield Site(prefix, state, hub, releases, pip_env(build.wheelhouse))


def test_upgrade_switches_the_venv_symlink_to_the_new_version(site: Site, build: Build) -> None:
    result = site.upgrade(site.releases.publish(build.good))

    assert result.returncode == 0, result.stderr
    assert os.readlink(site.link) == f"venvs/{GOOD_VERSION}"
    version = site.agent("version")
    assert version.stdout.startswith(f"cloudgpu-agent {GOOD_VERSION} "), version.stderr
    # The new version's smoke and then its trial run reached the hub before the switch, each
    # as a probe (the running agent's connection is never replaced).
    registers = _registers(site.hub)
    assert [(m.agent_version, m.probe) for m in registers] == [(GOOD_VERSION, True)] * 2
    assert f"trial run of {GOOD_VERSION} for {TRIAL_WINDOW_S} s" in result.stdout
    assert f"no agent is running on {site.state} now" in result.stdout
    assert (build.old_venv / "bin" / "cloudgpu-agent").exists()  # kept for a rollback
    assert sorted(p.name for p in (site.prefix / "venvs").iterdir()) == [GOOD_VERSION]
    # Its pip is the running one's, copied (supplier_agent/venv_seed.py): no ensurepip, so no
    # setuptools, and the new version can run the next upgrade's pip.
    new_python = site.prefix / "venvs" / GOOD_VERSION / "bin" / "python"
    pip = subprocess.run(
        [str(new_python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    )
    installed = {p["name"]: p["version"] for p in json.loads(pip.stdout)}
    assert installed["pip"] == _pip_version(build.old_venv)
    assert "setuptools" not in installed
    # No release key pinned (a host installed before signing): it says nothing was checked.
    assert "pins no release key, so nobody's signature is checked" in result.stdout


def _pip_version(venv: Path) -> str:
    argv = [str(venv / "bin" / "python"), "-c", "import pip; print(pip.__version__)"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def _registers(hub: HubPeer) -> list[Any]:
    return [m for c in hub.connections for m in c.received if getattr(m, "TYPE", "") == "register"]


def test_with_no_systemd_a_running_agent_is_named_as_still_on_the_old_version(
    site: Site, build: Build, tmp_path: Path
) -> None:
    with running_agent(site.state, tmp_path / "agent.log", env=site.env) as agent:
        live = site.hub.wait_for_connection()
        site.hub.wait_for(live, "register", lambda m: not m.probe)
        result = site.upgrade(site.releases.publish(build.good))
        # The trial ran next to it, without its state lock and without taking over its socket.
        assert not live.closed
        assert agent.poll() is None

    assert result.returncode == 0, result.stderr
    assert os.readlink(site.link) == f"venvs/{GOOD_VERSION}"
    assert (
        f"an agent (pid {agent.pid}) is running on {site.state} and still runs {__version__}: "
        f"whoever started it must restart it to run {GOOD_VERSION}"
    ) in result.stdout
    new = [m.probe for m in _registers(site.hub) if m.agent_version == GOOD_VERSION]
    assert new == [True, True]  # smoke and trial


def test_a_wheel_with_one_byte_changed_is_refused(site: Site, build: Build) -> None:
    data = bytearray(build.good.path.read_bytes())
    data[len(data) // 2] ^= 0x01
    url = site.releases.publish(build.good, data=bytes(data), sha256=build.good.sha256)

    result = site.upgrade(url)

    assert result.returncode == 1
    assert "sha256 mismatch" in result.stderr
    assert "nothing was changed" in result.stderr
    assert os.readlink(site.link) == str(build.old_venv)
    assert not (site.prefix / "venvs").exists()
    assert site.hub.connections == []
    assert site.agent("version").stdout.startswith(f"cloudgpu-agent {__version__} ")


def test_a_version_that_fails_its_smoke_is_rolled_back(
    site: Site, build: Build, tmp_path: Path
) -> None:
    # The installed agent is running (as the service would) while the upgrade fails.
    with running_agent(site.state, tmp_path / "agent.log", env=site.env):
        live = site.hub.wait_for_connection()
        site.hub.wait_for(live, "register", lambda m: not m.probe)
        result = site.upgrade(site.releases.publish(build.broken))
        # It stayed online throughout: same socket, still heartbeating after the failure.
        heartbeats = len([m for m in live.received if getattr(m, "TYPE", "") == "heartbeat"])
        site.hub.wait(
            lambda: len([m for m in live.received if getattr(m, "TYPE", "") == "heartbeat"])
            > heartbeats,
            what="a heartbeat after the failed upgrade",
        )
        assert not live.closed

    assert result.returncode == 1
    assert f"version {BROKEN_VERSION} failed its smoke test" in result.stderr
    assert "deliberately broken" in result.stderr
    assert "rolled back" in result.stderr
    assert os.readlink(site.link) == str(build.old_venv)
    assert list((site.prefix / "venvs").iterdir()) == []
    # The old version still runs and still reaches the hub.
    assert site.agent("version").stdout.startswith(f"cloudgpu-agent {__version__} ")
    smoke = site.agent("smoke", "--state", str(site.state))
    assert smoke.returncode == 0, smoke.stderr


def test_the_running_version_is_not_reinstalled(site: Site, build: Build) -> None:
    result = site.upgrade(site.releases.publish(build.current))

    assert result.returncode == 0, result.stderr
    assert f"already at version {__version__}" in result.stdout
    assert os.readlink(site.link) == str(build.old_venv)
    assert not (site.prefix / "venvs").exists()


def test_plain_http_to_another_host_is_refused(site: Site) -> None:
    result = site.upgrade("http://hub.example.com/agent/release.json")

    assert result.returncode == 1
    assert "https://" in result.stderr
    assert os.readlink(site.link).endswith(__version__)


def test_a_plain_venv_directory_is_kept_whole_for_a_rollback(site: Site, build: Build) -> None:
    # An installer that made `<prefix>/venv` a real virtualenv, not a symlink.
    site.link.unlink()
    _run([sys.executable, "-m", "venv", str(site.link)])
    _run(
        [
            str(site.link / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            str(build.current.path),
        ],
        env=site.env,
    )

    result = site.upgrade(site.releases.publish(build.good))

    assert result.returncode == 0, result.stderr
    assert os.readlink(site.link) == f"venvs/{GOOD_VERSION}"
    assert site.agent("version").stdout.startswith(f"cloudgpu-agent {GOOD_VERSION} ")
    previous = site.prefix / "venv.previous"
    assert f"rm {site.link} && mv {previous} {site.link}" in result.stdout
    # Its scripts name <prefix>/venv/bin/python: renamed back, it runs the old version again.
    site.link.unlink()
    previous.rename(site.link)
    assert site.agent("version").stdout.startswith(f"cloudgpu-agent {__version__} ")


# --- signed releases (supplier_agent/release_signing.py) ------------------------------------


def _unchanged(site: Site, build: Build) -> None:
    assert os.readlink(site.link) == str(build.old_venv)
    assert not (site.prefix / "venvs").exists()
    assert site.hub.connections == []


def test_a_pinned_key_refuses_an_unsigned_release_before_downloading(
    site: Site, build: Build
) -> None:
    site.pin(Ed25519PrivateKey.generate())
    result = site.upgrade(site.releases.publish(build.good))
    assert result.returncode == 1
    assert f"refusing release {GOOD_VERSION}: the release is not signed" in result.stderr
    assert "nothing was changed" in result.stderr
    assert "downloading" not in result.stdout
    _unchanged(site, build)


def test_a_release_signed_by_a_key_not_pinned_is_refused(site: Site, build: Build) -> None:
    pinned, stranger = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    site.pin(pinned)
    result = site.upgrade(site.releases.publish(build.good, signed_by=stranger))
    assert result.returncode == 1
    assert (
        f"no key this agent trusts signed the release (signed by "
        f"{release_signing.key_id(_public(stranger))})"
    ) in result.stderr
    _unchanged(site, build)


def test_a_signed_release_with_another_wheel_put_in_is_refused(site: Site, build: Build) -> None:
    key = Ed25519PrivateKey.generate()
    site.pin(key)
    # The hub's description names the tampered wheel's own sha256; the signature is over the
    # real one, so the description no longer matches what was signed.
    tampered = bytearray(build.good.path.read_bytes())
    tampered[len(tampered) // 2] ^= 0x01
    url = site.releases.publish(
        build.good,
        data=bytes(tampered),
        sha256=hashlib.sha256(bytes(tampered)).hexdigest(),
        signed_by=key,
    )
    result = site.upgrade(url)
    assert result.returncode == 1
    assert "does not match this release (tampered with" in result.stderr
    _unchanged(site, build)


def test_a_signed_release_installs_and_pins_the_next_key(site: Site, build: Build) -> None:
    old_key, next_key = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    site.pin(old_key)
    url = site.releases.publish(build.good, signed_by=old_key, next_keys=(_public(next_key),))
    result = site.upgrade(url)
    assert result.returncode == 0, result.stderr
    assert f"signed by pinned key {release_signing.key_id(_public(old_key))}" in result.stdout
    assert os.readlink(site.link) == f"venvs/{GOOD_VERSION}"
    pinned = read_file(site.state)["release_keys"].split(",")
    assert pinned == [_public(old_key), _public(next_key)]
    # A later release signed by the next key alone is one this agent takes.
    later = release_signing.sign(
        next_key, "99.1.0", "cloudgpu_agent-99.1.0-py3-none-any.whl", "0" * 64, []
    )
    assert release_signing.verify(
        "99.1.0", "cloudgpu_agent-99.1.0-py3-none-any.whl", "0" * 64, [], [later], pinned
    ) == _public(next_key)
