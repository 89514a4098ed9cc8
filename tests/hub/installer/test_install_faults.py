"""``install.sh`` run for real by bash when things go wrong on the supplier's machine (issue 22):
redirects and URLs that leave https, a nearly full disk, a cut script, a re-run over a
configured or upgraded prefix, another install at the same time, an older release, and the
messages for a missing TMPDIR, a hub that serves no release and a download that times out.

Servers are this module's own, on loopback: plain HTTP, HTTPS with a certificate made here
(handed to curl through CURL_CA_BUNDLE), and a protocol peer that also serves ``/agent/*``
so the script's own ``smoke`` reaches a hub (tests/support/installed_agent.py). pip installs
offline from a wheelhouse. A re-run starts from a copy of one first install per session (the
``installed_agent`` fixture, tests/hub/installer/conftest.py), at the path it was made at.
"""

from __future__ import annotations

import configparser
import contextlib
import datetime
import fcntl
import http.server
import ipaddress
import json
import os
import ssl
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from hub.installer.services import WheelInfo
from hub.lib.ports import free_port
from supplier_agent import __version__
from tests.support.agents import new_token
from tests.support.installed_agent import AgentHub, InstalledAgent, run_install

# Virtualenvs, pip and real agents: seconds each, out of the fast lane (tests/conftest.py).
pytestmark = pytest.mark.slow

MARKER = "cloudgpu-install:"
Handler = Callable[[http.server.BaseHTTPRequestHandler], None]


@pytest.fixture
def script(client: Any, settings: Any) -> str:
    """The script as the hub serves it, its default hub a port where nothing listens: a run
    that lost its arguments cannot reach anything."""
    settings.HUB_PUBLIC_URL = f"http://127.0.0.1:{free_port()}"
    response = client.get("/install.sh")
    assert response.status_code == 200
    return str(response.content.decode())


# --- servers -----------------------------------------------------------------------------------


class Served:
    """A loopback HTTP(S) server: ``routes`` maps a path to a handler; it counts requests."""

    def __init__(self, routes: dict[str, Handler], *, tls: ssl.SSLContext | None = None) -> None:
        self.routes = routes
        self.requests: list[str] = []
        self.stop = threading.Event()
        served = self

        class _Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                served.requests.append(self.path)
                route = served.routes.get(self.path)
                if route is None:
                    self.send_error(404)
                    return
                with contextlib.suppress(OSError):  # the client went away
                    route(self)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.do_GET()

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.scheme = "https" if tls else "http"
        # shutdown() waits for serve_forever to look at its flag: every 0.05 s, not the default
        # 0.5 s that each test would wait out.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def __enter__(self) -> Served:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._server.shutdown()
        self._server.server_close()


def send(body: bytes, status: int = 200) -> Handler:
    def handler(request: http.server.BaseHTTPRequestHandler) -> None:
        request.send_response(status)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)

    return handler


def redirect(location: str) -> Handler:
    def handler(request: http.server.BaseHTTPRequestHandler) -> None:
        request.send_response(302)
        request.send_header("Location", location)
        request.send_header("Content-Length", "0")
        request.end_headers()

    return handler


def release_routes(wheel: WheelInfo, base: str = "") -> dict[str, Handler]:
    release = {
        "version": wheel.version,
        "filename": wheel.filename,
        "sha256": wheel.sha256,
        "url": f"{base}/agent/{wheel.filename}",
    }
    return {
        "/agent/release.json": send(json.dumps(release).encode()),
        f"/agent/{wheel.filename}": send(wheel.path.read_bytes()),
    }


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, Path]:
    """A server context for 127.0.0.1 and the CA file curl trusts it by."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return context, cert_path


def _agent_version(prefix: Path) -> str:
    result = subprocess.run(
        [str(prefix / "venv" / "bin" / "cloudgpu-agent"), "version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


# --- 1, 2: https only after the first hop; URLs parsed, credentials refused ---------------------


def test_a_redirect_from_https_to_plain_http_is_refused(
    script: str, agent_wheel: WheelInfo, tls: tuple[ssl.SSLContext, Path], tmp_path: Path
) -> None:
    context, ca = tls
    prefix = tmp_path / "prefix"
    with Served(release_routes(agent_wheel)) as plain:
        # 0.0.0.0 reaches this host, but it is not a loopback address: plain http to it is not
        # allowed, and only a parsed URL can tell.
        target = f"http://0.0.0.0:{plain.port}"
        routes = {
            "/agent/release.json": redirect(f"{target}/agent/release.json"),
            f"/agent/{agent_wheel.filename}": redirect(f"{target}/agent/{agent_wheel.filename}"),
        }
        with Served(routes, tls=context) as secure:
            result = run_install(
                script,
                *("--prefix", str(prefix), "--no-systemd", "--runtime", "mock"),
                *("--hub", secure.url),
                tmp=tmp_path,
                env={"CLOUDGPU_TOKEN": new_token(), "CURL_CA_BUNDLE": str(ca)},
            )
            assert secure.requests == ["/agent/release.json"]
        assert plain.requests == []
    # 3, as for any hub this host cannot use (issue 34 item 6; it was 1).
    assert result.returncode == 3
    assert f"{MARKER} error: refusing the redirect from {secure.url}/agent/release.json" in (
        result.stderr
    )
    assert "plain http" in result.stderr
    assert not (prefix / "venv").exists()


@pytest.mark.parametrize(
    "hub",
    ["http://127.0.0.1@0.0.0.0:{port}", "https://user:secret@127.0.0.1:{port}"],
)
def test_a_hub_url_with_credentials_is_refused_before_any_download(
    script: str, agent_wheel: WheelInfo, tmp_path: Path, hub: str
) -> None:
    prefix = tmp_path / "prefix"
    with Served(release_routes(agent_wheel)) as server:
        result = run_install(
            script,
            *("--prefix", str(prefix), "--no-systemd", "--runtime", "mock"),
            *("--hub", hub.format(port=server.port)),
            tmp=tmp_path,
            env={"CLOUDGPU_TOKEN": new_token()},
        )
        assert server.requests == []
    assert result.returncode == 2
    assert "credentials" in result.stderr
    assert "fetching" not in result.stderr
    assert not prefix.exists()


# --- 6: a script cut anywhere in its last bytes runs nothing ----------------------------------


def test_a_script_cut_at_any_of_its_last_64_bytes_runs_nothing(script: str, tmp_path: Path) -> None:
    data = script.encode()
    prefix = tmp_path / "prefix"
    args = ("--prefix", str(prefix), "--no-systemd", "--runtime", "mock")
    hub = ("--hub", f"http://127.0.0.1:{free_port()}")  # nothing listens there

    whole = run_install(script, *args, *hub, tmp=tmp_path, env={"CLOUDGPU_TOKEN": new_token()})
    assert f"{MARKER} fetching the agent release from {hub[1]}" in whole.stderr

    # Without only its final newline the call is complete: it runs, with the user's arguments.
    assert data.endswith(b'main "$@" cloudgpu-install-end\n')
    unterminated = run_install(
        data[:-1].decode(), *args, *hub, tmp=tmp_path, env={"CLOUDGPU_TOKEN": new_token()}
    )
    assert f"{MARKER} fetching the agent release from {hub[1]}" in unterminated.stderr

    for cut in range(len(data) - 64, len(data) - 1):
        part = data[:cut].decode()
        result = run_install(part, *args, *hub, tmp=tmp_path, env={"CLOUDGPU_TOKEN": new_token()})
        output = result.stdout + result.stderr
        assert MARKER not in output, f"cut at byte {cut} of {len(data)} ran:\n{output}"
        assert not prefix.exists()
        tail = part.rsplit("\n", 1)[-1]
        if tail == "main" or tail.startswith('main "$@"'):
            # main was called, without the end marker: it says so and does nothing.
            assert "install.sh: this copy of the script was cut short" in result.stderr
            assert result.returncode == 1


# --- 10: messages ------------------------------------------------------------------------------


def test_a_missing_tmpdir_is_named(script: str, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-folder"
    result = run_install(
        script,
        *("--prefix", str(tmp_path / "prefix"), "--no-systemd", "--runtime", "mock"),
        *("--hub", f"http://127.0.0.1:{free_port()}"),
        tmp=tmp_path,
        env={"CLOUDGPU_TOKEN": new_token(), "TMPDIR": str(missing)},
    )
    assert result.returncode != 0
    assert f"{MARKER} error: TMPDIR={missing} is not a writable folder" in result.stderr


def test_a_hub_that_serves_no_release_was_reached(script: str, tmp_path: Path) -> None:
    with Served({}) as server:
        result = run_install(
            script,
            *("--prefix", str(tmp_path / "prefix"), "--no-systemd", "--runtime", "mock"),
            *("--hub", server.url),
            tmp=tmp_path,
            env={"CLOUDGPU_TOKEN": new_token()},
        )
    assert result.returncode == 3
    assert "was reached, but it serves no agent release" in result.stderr
    assert "reach the hub" not in result.stderr


def test_a_hub_that_fails_the_enrollment_with_a_5xx_is_unreachable_not_a_refusal(
    script: str, agent_wheel: WheelInfo, wheelhouse: Path, tmp_path: Path
) -> None:
    with Served({}) as server:
        server.routes = {
            **release_routes(agent_wheel, server.url),
            "/agent/enroll": send(b"<html>502 Bad Gateway</html>", status=502),
        }
        result = run_install(
            script,
            "cgpe_" + "a" * 36,
            *("--prefix", str(tmp_path / "prefix"), "--no-systemd", "--runtime", "mock"),
            *("--hub", server.url),
            tmp=tmp_path,
            env={"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse)},
        )
    assert result.returncode == 3, result.stderr
    assert "could not answer at" in result.stderr
    assert "(HTTP 502)" in result.stderr
    assert "refused" not in result.stderr
    assert not (tmp_path / "prefix" / "venv").exists()


def test_a_download_that_times_out_says_which(script: str, tmp_path: Path) -> None:
    def trickle(request: http.server.BaseHTTPRequestHandler) -> None:
        request.send_response(200)
        request.send_header("Content-Length", "100000")
        request.end_headers()
        while not server.stop.wait(0.05):
            request.wfile.write(b" ")
            request.wfile.flush()

    with Served({"/agent/release.json": trickle}) as server:
        result = run_install(
            script,
            *("--prefix", str(tmp_path / "prefix"), "--no-systemd", "--runtime", "mock"),
            *("--hub", server.url, "--download-timeout", "2"),
            tmp=tmp_path,
            env={"CLOUDGPU_TOKEN": new_token()},
        )
    assert result.returncode == 3
    assert f"{MARKER} error: timed out downloading the release description" in result.stderr


# --- 3: a re-run installs beside the running version and switches only when it works ------------


def test_a_rerun_on_a_nearly_full_disk_refuses_and_keeps_the_agent(
    script: str, installed_agent: InstalledAgent, tmp_path: Path
) -> None:
    # The installed agent, on a tmpfs of 320 MiB of its own (mounted at `disk`).
    disk, prefix = installed_agent.root, installed_agent.prefix
    with installed_agent.fresh_copy(disk_mib=320) as (env, args):
        before = os.readlink(prefix / "venv")
        stat = os.statvfs(disk)
        fill = stat.f_bavail * stat.f_frsize - 60 * 1024 * 1024  # leave 60 MiB
        with open(disk / "filler", "wb") as out:
            out.truncate(0)
            chunk = b"\0" * (1 << 20)
            for _ in range(fill >> 20):
                out.write(chunk)

        result = run_install(script, *args, tmp=tmp_path, env=env)

        assert result.returncode != 0
        assert f"{prefix} needs 200 MiB free" in result.stderr
        assert "nothing was changed" in result.stderr
        assert os.readlink(prefix / "venv") == before
        agent = prefix / "venv" / "bin" / "cloudgpu-agent"
        assert agent.stat().st_size > 0
        assert os.access(agent, os.X_OK)
        assert _agent_version(prefix).startswith(f"cloudgpu-agent {__version__} ")


def test_a_rerun_whose_pip_fails_leaves_the_running_version_alone(
    script: str, installed_agent: InstalledAgent, tmp_path: Path
) -> None:
    prefix = installed_agent.prefix
    with installed_agent.fresh_copy() as (env, args):
        before = os.readlink(prefix / "venv")
        empty = tmp_path / "empty-wheelhouse"
        empty.mkdir()
        result = run_install(script, *args, tmp=tmp_path, env={**env, "PIP_FIND_LINKS": str(empty)})

    assert result.returncode != 0
    assert "pip could not install the agent (see above); nothing was changed" in result.stderr
    assert os.readlink(prefix / "venv") == before
    assert sorted(p.name for p in (prefix / "venvs").iterdir()) == [before.split("/")[-1]]
    assert _agent_version(prefix).startswith(f"cloudgpu-agent {__version__} ")


# --- 7: a re-run keeps the configuration, needs no token, names folders truthfully, locks -----


def test_a_rerun_keeps_the_configuration_and_needs_no_token(
    script: str, installed_agent: InstalledAgent, tmp_path: Path
) -> None:
    prefix = installed_agent.prefix
    config = prefix / "state" / "cloudgpu-agent.conf"
    with installed_agent.fresh_copy() as (env, args):
        parser = configparser.ConfigParser(interpolation=None)
        parser.read(config)
        parser["agent"]["compute_mode"] = "skip"
        with open(config, "w") as out:
            parser.write(out)
        settings_before = config.read_bytes()

        result = run_install(script, *args, tmp=tmp_path, env=env)

    assert result.returncode == 0, result.stderr
    assert config.read_bytes() == settings_before  # runtime mock, compute mode skip, the token
    # Version folders say which version they hold; the first stays for one rollback.
    assert os.readlink(prefix / "venv") == f"venvs/{__version__}-2"
    assert sorted(p.name for p in (prefix / "venvs").iterdir()) == [
        __version__,
        f"{__version__}-2",
    ]
    # The new version's pip was copied from the installed one (supplier_agent/venv_seed.py),
    # not unpacked again by ensurepip: the same file, its time kept.
    (old_pip,) = (prefix / "venvs" / __version__).glob("lib/python3*/site-packages/pip/__init__.py")
    (new_pip,) = (prefix / "venvs" / f"{__version__}-2").glob(
        "lib/python3*/site-packages/pip/__init__.py"
    )
    assert new_pip.stat().st_mtime_ns == old_pip.stat().st_mtime_ns


# A re-run with an option changes only that setting (runtime docker to mock, the compute mode
# and the token kept): test_install_atomic.py's
# test_a_rerun_with_a_runtime_or_a_token_keeps_every_other_setting, whose first re-run it is.


def test_an_install_while_an_upgrade_runs_is_refused(
    script: str, agent_wheel: WheelInfo, tmp_path: Path
) -> None:
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    # The lock `cloudgpu-agent upgrade` holds while it works (supplier_agent/upgrade.py).
    fd = os.open(prefix / ".upgrade.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with Served(release_routes(agent_wheel)) as server:
            result = run_install(
                script,
                *("--prefix", str(prefix), "--no-systemd", "--runtime", "mock"),
                *("--hub", server.url),
                tmp=tmp_path,
                env={"CLOUDGPU_TOKEN": new_token()},
            )
    finally:
        os.close(fd)
    assert result.returncode != 0
    assert f"another install or upgrade of {prefix} is running" in result.stderr
    assert sorted(p.name for p in prefix.iterdir()) == [".upgrade.lock"]


# --- 8: no silent downgrade ---------------------------------------------------------------------


def test_an_older_release_than_the_installed_one_is_refused_unless_allowed(
    script: str, agent_wheel: WheelInfo, wheelhouse: Path, tmp_path: Path
) -> None:
    prefix = tmp_path / "prefix"
    newer = prefix / "venvs" / "99.1.0" / "bin"
    newer.mkdir(parents=True)
    (newer / "cloudgpu-agent").write_text(
        '#!/bin/sh\necho "cloudgpu-agent 99.1.0 (Python 3.11.0)"\n'
    )
    (newer / "cloudgpu-agent").chmod(0o755)
    (prefix / "venv").symlink_to("venvs/99.1.0")
    token = new_token()
    with AgentHub(token, agent_wheel) as hub:
        args = ("--prefix", str(prefix), "--no-systemd", "--runtime", "mock", "--hub", hub.url)
        args += ("--health-window", "1")
        env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse), "CLOUDGPU_TOKEN": token}
        refused = run_install(script, *args, tmp=tmp_path, env=env)
        assert refused.returncode != 0
        assert (
            f"the hub offers cloudgpu-agent {__version__}, older than the installed 99.1.0"
            in refused.stderr
        )
        assert "--allow-downgrade" in refused.stderr
        assert os.readlink(prefix / "venv") == "venvs/99.1.0"
        assert sorted(p.name for p in (prefix / "venvs").iterdir()) == ["99.1.0"]

        allowed = run_install(script, *args, "--allow-downgrade", tmp=tmp_path, env=env)
    assert allowed.returncode == 0, allowed.stderr
    assert os.readlink(prefix / "venv") == f"venvs/{__version__}"
