"""``install.sh`` run for real by bash: lint, truncation, a tampered wheel, a live hub."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest

from hub.accounts.models import User
from hub.installer.services import WheelInfo
from hub.lib.ports import free_port, wait_for_port
from hub.suppliers.models import Host
from tests.support.agents import agent_env
from tests.support.hub_stack import hub_stack
from tests.support.polling import wait_for
from tests.support.processes import running

# Every line the script itself prints starts with this; bash's own errors never do.
MARKER = "cloudgpu-install:"
FAKE_TOKEN = "cgpu_notarealtokenatallnotarealtoken000000"


def run_script(
    script: str, *args: str, tmp: Path, token: str = FAKE_TOKEN, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """``curl ... | bash -s -- ARGS`` with the token in CLOUDGPU_TOKEN, the way CI runs it."""
    temp = tmp / "tmp"
    temp.mkdir(exist_ok=True)
    env = agent_env(CLOUDGPU_TOKEN=token, TMPDIR=str(temp))
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
    assert lines[-1] == 'main "$@"\n'
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
    tmp_path: Path,
) -> None:
    supplier = User.objects.create_user(username=f"supplier-{uuid.uuid4().hex[:6]}")
    prefix = tmp_path / "prefix"
    venv, state = prefix / "venv", prefix / "state"
    with hub_stack(tmp_path, AGENT_DIST_DIR=str(tmp_path / "agent-dist")) as stack:
        token = stack.manage("hub", "token", "create", "--owner", supplier.username)
        with urllib.request.urlopen(f"{stack.url()}/install.sh", timeout=30) as response:  # noqa: S310
            script = response.read().decode()
        args = ("--prefix", str(prefix), "--no-systemd", "--runtime", "mock", "--hub", stack.url())

        first = run_script(script, *args, tmp=tmp_path, token=token, timeout_s=600)
        assert first.returncode == 0, first.stderr
        assert f"{MARKER} success:" in first.stderr
        assert token not in first.stdout + first.stderr
        config = state / "cloudgpu-agent.conf"
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        holders = [p for p in prefix.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
        assert holders == [config]
        venv_id = (venv / "pyvenv.cfg").stat().st_ino

        second = run_script(script, *args, tmp=tmp_path, token=token, timeout_s=600)
        assert second.returncode == 0, second.stderr
        assert f"{MARKER} upgrading the existing installation in {venv}" in second.stderr
        assert (venv / "pyvenv.cfg").stat().st_ino == venv_id
        site = next((venv / "lib").glob("python3*/site-packages"))
        assert len(list(site.glob("cloudgpu_agent-*.dist-info"))) == 1
        assert list((tmp_path / "tmp").iterdir()) == []

        agent = [str(venv / "bin" / "cloudgpu-agent"), "run", "--state", str(state)]
        with running(agent, env=agent_env(), log=tmp_path / "agent.log"):
            host = wait_for(lambda: _online_host(supplier), timeout_s=60, what="host online")
        assert host.runtime == "mock"
