"""``install.sh`` run for real by bash: lint, truncation, a tampered wheel, a token on the
command line, enrollment codes against a live hub."""

from __future__ import annotations

import configparser
import json
import os
import shutil
import stat
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hub.accounts.models import User
from hub.installer import enrollment
from hub.installer.models import EnrollmentCode
from hub.installer.services import WheelInfo
from hub.lib.ports import free_port, wait_for_port
from hub.suppliers.models import Host
from hub.suppliers.services import authenticate_agent_token
from tests.support.agents import agent_env
from tests.support.hub_stack import hub_stack, web_only
from tests.support.polling import wait_for
from tests.support.processes import running

# Every line the script itself prints starts with this; bash's own errors never do.
MARKER = "cloudgpu-install:"
FAKE_TOKEN = "cgpu_notarealtokenatallnotarealtoken000000"
# These tests fail exchanges from 127.0.0.1 on purpose, run after run, and Redis keeps count.
NO_ENROLL_LIMIT = {"ENROLLMENT_RATE_LIMIT": "100000"}


def run_script(
    script: str,
    *args: str,
    tmp: Path,
    token: str | None = FAKE_TOKEN,
    timeout_s: float = 60,
    path_prefix: Path | None = None,
    extra_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``curl ... | bash -s -- ARGS`` with the token (if any) in CLOUDGPU_TOKEN, the way CI runs
    it; stdin is the script, so there is no terminal to prompt on."""
    temp = tmp / "tmp"
    temp.mkdir(exist_ok=True)
    env = agent_env(TMPDIR=str(temp), **(extra_env or {}))
    if token is not None:
        env["CLOUDGPU_TOKEN"] = token
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    return subprocess.run(
        ["bash", "-s", "--", *args],
        input=script,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        timeout=timeout_s,
        check=False,
    )


def test_shellcheck_is_clean(install_script: str, tmp_path: Path) -> None:
    if shutil.which("shellcheck") is None:
        if os.environ.get("CLOUDGPU_REQUIRE_DOCKER") == "1":
            pytest.fail("CLOUDGPU_REQUIRE_DOCKER=1 but shellcheck is not installed")
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    path = tmp_path / "install.sh"
    path.write_text(install_script)
    result = subprocess.run(
        ["shellcheck", "--shell=bash", "--severity=style", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_truncated_download_runs_nothing(install_script: str, tmp_path: Path) -> None:
    lines = install_script.splitlines(keepends=True)
    assert lines[-1] == 'main "$@" cloudgpu-install-end\n'
    prefix = tmp_path / "prefix"
    args = ("--prefix", str(prefix), "--no-systemd", "--runtime", "mock")
    hub = ("--hub", f"http://127.0.0.1:{free_port()}")  # nothing listens there

    # The whole script does work (and fails at the download): the check below can see it.
    whole = run_script(install_script, *args, *hub, tmp=tmp_path)
    assert whole.returncode != 0
    assert f"{MARKER} fetching the agent release" in whole.stderr
    assert not prefix.exists()

    for cut in range(len(lines)):
        result = run_script("".join(lines[:cut]), *args, *hub, tmp=tmp_path)
        output = result.stdout + result.stderr
        assert MARKER not in output, f"a download cut after line {cut} ran:\n{output}"
        assert not prefix.exists(), f"a download cut after line {cut} installed something"
        assert result.stdout == ""
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_tampered_wheel_installs_nothing(
    install_script: str, agent_wheel: WheelInfo, tmp_path: Path
) -> None:
    served = tmp_path / "served" / "agent"
    served.mkdir(parents=True)
    data = bytearray(agent_wheel.path.read_bytes())
    data[len(data) // 2] ^= 0x01
    (served / agent_wheel.filename).write_bytes(bytes(data))
    port = free_port()
    release = {
        "version": agent_wheel.version,
        "filename": agent_wheel.filename,
        "sha256": agent_wheel.sha256,
        "url": f"http://127.0.0.1:{port}/agent/{agent_wheel.filename}",
    }
    (served / "release.json").write_text(json.dumps(release))
    prefix = tmp_path / "prefix"
    server = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)]
    with running([*server, "--directory", str(served.parent)]):
        assert wait_for_port(port, timeout_s=30)
        result = run_script(
            install_script,
            *("--prefix", str(prefix), "--no-systemd", "--runtime", "mock"),
            *("--hub", f"http://127.0.0.1:{port}"),
            tmp=tmp_path,
        )
    assert result.returncode != 0
    assert f"sha256 mismatch for {agent_wheel.filename}" in result.stderr
    assert "nothing was installed" in result.stderr
    assert not prefix.exists()
    # The private download folder went with the script.
    assert list((tmp_path / "tmp").iterdir()) == []


def _online_host(owner: User) -> Host | None:
    return Host.objects.filter(owner=owner, status=Host.Status.ONLINE).first()


@pytest.mark.django_db(transaction=True)
def test_installing_from_a_live_hub_brings_the_host_online_and_reruns_upgrade_in_place(
    agent_wheel: WheelInfo, wheelhouse: Path, tmp_path: Path
) -> None:
    supplier = User.objects.create_user(username=f"supplier-{uuid.uuid4().hex[:6]}")
    prefix = tmp_path / "prefix"
    venv, state = prefix / "venv", prefix / "state"
    argv_log = tmp_path / "argv.log"
    shims = _recording_shims(tmp_path / "shims", argv_log, "curl", "python3")
    # The hub serves the session's wheel (built from this tree: the hub finds it built, as in
    # the test below; test_agent_wheel.py tests the build), and pip installs its dependencies
    # offline from the session's wheelhouse, as PIP_* settings on a supplier's host would.
    dist = str(agent_wheel.path.parent.parent)
    pip = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse)}
    with hub_stack(tmp_path, AGENT_DIST_DIR=dist) as stack:
        code, plaintext = enrollment.create_enrollment_code(supplier, "rig-1")
        with urllib.request.urlopen(f"{stack.url()}/install.sh", timeout=30) as response:  # noqa: S310
            script = response.read().decode()
        args = ("--prefix", str(prefix), "--no-systemd", "--runtime", "mock", "--hub", stack.url())
        args += ("--health-window", "1")  # the trial run of each new version, before the switch

        # The one-liner: the code as bash's argument, no token anywhere.
        first = run_script(
            script,
            plaintext,
            *args,
            tmp=tmp_path,
            token=None,
            timeout_s=600,
            path_prefix=shims,
            extra_env=pip,
        )
        assert first.returncode == 0, first.stderr
        assert f"{MARKER} success:" in first.stderr
        config = state / "cloudgpu-agent.conf"
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        parser = configparser.ConfigParser(interpolation=None)
        parser.read(config)
        token = parser["agent"]["token"]
        code.refresh_from_db()
        assert code.used_at is not None
        assert authenticate_agent_token(token) == code.token
        assert code.token.name == "rig-1"
        assert token not in first.stdout + first.stderr
        assert plaintext not in first.stdout + first.stderr
        holders = [p for p in prefix.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
        assert holders == [config]
        assert not [
            p for p in prefix.rglob("*") if p.is_file() and plaintext.encode() in p.read_bytes()
        ]
        # curl and python3 ran (the log proves the shims saw them), never with either secret.
        commands = argv_log.read_text()
        assert "/agent/enroll" in commands
        assert plaintext not in commands
        assert token not in commands
        venv_id = (venv / "pyvenv.cfg").stat().st_ino
        config_bytes = config.read_bytes()

        # The same one-liner again (e.g. from shell history): refused, nothing touched.
        again = run_script(script, plaintext, *args, tmp=tmp_path, token=None, timeout_s=120)
        assert again.returncode == 4
        assert "already used" in again.stderr
        assert config.read_bytes() == config_bytes
        assert supplier.agent_tokens.count() == 1

        second = run_script(script, *args, tmp=tmp_path, token=token, timeout_s=600, extra_env=pip)
        assert second.returncode == 0, second.stderr
        # Installed beside the running version, then switched to (issue 22): the first stays.
        assert "beside the installed" in second.stderr
        assert (venv / "pyvenv.cfg").stat().st_ino != venv_id
        assert os.readlink(venv).endswith("-2")
        assert os.readlink(venv).startswith("venvs/")
        site = next((venv / "lib").glob("python3*/site-packages"))
        assert len(list(site.glob("cloudgpu_agent-*.dist-info"))) == 1
        assert list((tmp_path / "tmp").iterdir()) == []

        agent = [str(venv / "bin" / "cloudgpu-agent"), "run", "--state", str(state)]
        with running(agent, env=agent_env(), log=tmp_path / "agent.log"):
            host = wait_for(lambda: _online_host(supplier), timeout_s=60, what="host online")
        assert host.runtime == "mock"
        assert host.token == code.token


# --- secrets on the command line ------------------------------------------------------------


@pytest.mark.parametrize(
    ("argument", "says"),
    [
        (FAKE_TOKEN, "that is an agent token"),
        ("s3cret-thing", "not an enrollment code"),
        ("cgpe_tooshort", "the enrollment code has an unexpected form"),
    ],
)
def test_a_token_or_anything_but_a_code_on_the_command_line_is_refused_before_any_work(
    install_script: str, tmp_path: Path, argument: str, says: str
) -> None:
    prefix = tmp_path / "prefix"
    result = run_script(
        install_script,
        argument,
        *("--prefix", str(prefix), "--no-systemd", "--runtime", "mock"),
        *("--hub", f"http://127.0.0.1:{free_port()}"),
        tmp=tmp_path,
        token=None,
    )
    assert result.returncode == 2
    assert says in result.stderr
    assert argument not in result.stdout + result.stderr
    assert "fetching" not in result.stderr
    assert not prefix.exists()


def test_the_refusal_of_a_token_on_the_command_line_names_the_ways_that_work(
    install_script: str, tmp_path: Path
) -> None:
    result = run_script(install_script, FAKE_TOKEN, tmp=tmp_path, token=None)
    assert result.returncode == 2
    for way in ("ps", "shell history", "install command", "enrollment code", "CLOUDGPU_TOKEN"):
        assert way in result.stderr


def _recording_shims(folder: Path, log: Path, *names: str) -> Path:
    """Stand-ins for ``names`` on PATH that record each argv to ``log`` and then run the real
    program: the script must never hand a secret to a command line."""
    folder.mkdir()
    for name in names:
        real = shutil.which(name)
        assert real is not None, name
        shim = folder / name
        shim.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >>"{log}"\nexec "{real}" "$@"\n')
        shim.chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def refusing_hub(
    agent_wheel: WheelInfo, django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One Daphne on the test database for the refused codes below (seconds to start, once):
    each case makes its code in the database, and the hub reads it from there per request."""
    dist = str(agent_wheel.path.parent.parent)
    log = tmp_path_factory.mktemp("refusing-hub") / "web.log"
    with web_only(log, AGENT_DIST_DIR=dist, **NO_ENROLL_LIMIT) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("spoil", ["used", "expired", "revoked", "unknown"])
def test_a_used_expired_cancelled_or_unknown_code_installs_nothing_and_says_why(
    refusing_hub: str, tmp_path: Path, spoil: str
) -> None:
    supplier = User.objects.create_user(username=f"supplier-{uuid.uuid4().hex[:6]}")
    code, plaintext = enrollment.create_enrollment_code(supplier)
    if spoil == "used":
        enrollment.exchange_enrollment_code(plaintext, address="192.0.2.1")
    elif spoil == "expired":
        EnrollmentCode.objects.filter(pk=code.pk).update(expires_at=code.created_at)
    elif spoil == "revoked":
        enrollment.revoke_enrollment_code(supplier, code.pk)
    else:
        plaintext = enrollment.tokens.generate_token(enrollment.PREFIX)
    prefix = tmp_path / "prefix"
    hub = refusing_hub
    with urllib.request.urlopen(f"{hub}/install.sh", timeout=30) as response:  # noqa: S310
        script = response.read().decode()
    result = run_script(
        script,
        plaintext,
        *("--prefix", str(prefix), "--no-systemd", "--runtime", "mock", "--hub", hub),
        tmp=tmp_path,
        token=None,
        timeout_s=120,
    )
    words = {
        "used": "already used",
        "expired": "has expired",
        "revoked": "was cancelled",
        "unknown": "knows no such enrollment code",
    }[spoil]
    assert result.returncode == 4, result.stderr
    assert f"{MARKER} error: the hub refused the enrollment code: " in result.stderr
    assert words in result.stderr
    assert "create a new install command" in result.stderr
    assert not prefix.exists()
    assert list((tmp_path / "tmp").iterdir()) == []
    tokens_after = supplier.agent_tokens.count()
    assert tokens_after == (1 if spoil == "used" else 0)
