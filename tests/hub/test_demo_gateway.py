"""The local trial's gateway plan (hub/lib/demo_gateway.py): where it cannot run, it says why
and which Debian packages to install, and the runner goes on without it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from hub.lib import demo_gateway


def test_missing_packages_are_named_with_the_apt_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(demo_gateway, "SSHD", str(tmp_path / "no-sshd"))
    monkeypatch.setenv("PATH", str(tmp_path))  # neither nginx nor ssh-keygen on it
    assert demo_gateway.missing_packages() == ["openssh-server", "openssh-client", "nginx-light"]
    with pytest.raises(demo_gateway.GatewayUnavailable) as refused:
        demo_gateway.plan(tmp_path / "state", 1, 2)
    assert "apt install openssh-server openssh-client nginx-light" in str(refused.value)
    assert not (tmp_path / "state").exists()  # nothing made for a gateway that cannot run


def test_a_state_folder_sshd_refuses_puts_the_gateway_in_a_folder_of_its_own(
    tmp_path: Path,
) -> None:
    """A clone in /root (0700) or under /tmp (writable by all): the gateway's files go where
    sshd's rules hold (issue 34 item 1), one folder per state folder, made again the same."""
    if demo_gateway.missing_packages():
        pytest.skip(f"not installed: {demo_gateway.missing_packages()}")
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    state = shared / "state"
    state.mkdir()
    assert demo_gateway._folder_problem(state) is not None
    gateway = demo_gateway.plan(state, 0, 0)
    try:
        assert not gateway.folder.is_relative_to(tmp_path)
        assert demo_gateway._folder_problem(gateway.folder) is None
        assert gateway.host_keys_file.exists()
        assert demo_gateway.plan(state, 0, 0).folder == gateway.folder
        other = tmp_path / "other-state"
        other.mkdir(mode=0o700)
        assert demo_gateway.gateway_folder(other) != gateway.folder
    finally:
        shutil.rmtree(gateway.folder, ignore_errors=True)


def test_a_state_folder_sshd_accepts_keeps_the_gateway_inside(tmp_path: Path) -> None:
    state = Path(tempfile.mkdtemp(prefix="cloudgpu-gw-state-", dir="/run"))
    try:
        state.chmod(0o755)
        if demo_gateway._folder_problem(state) is not None:
            pytest.skip(f"/run breaks sshd's rules here: {demo_gateway._folder_problem(state)}")
        assert demo_gateway.gateway_folder(state) == state / "gateway"
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_when_no_folder_qualifies_the_gateway_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    (shared / "state").mkdir()
    monkeypatch.setattr(demo_gateway, "_private_root", lambda: shared / "private")
    with pytest.raises(demo_gateway.GatewayUnavailable, match="writable by its owner only"):
        demo_gateway.gateway_folder(shared / "state")


def test_the_hub_gets_the_secret_by_file_and_urls_under_localhost(tmp_path: Path) -> None:
    gateway = demo_gateway.DemoGateway(tmp_path, tmp_path / "secret", 2222, 8080)
    settings = gateway.hub_settings()
    assert settings["TUNNEL_DOMAIN"] == "localhost"
    assert settings["TUNNEL_URL_PORT"] == "8080"
    assert settings["TUNNEL_GATEWAY_SECRET_FILE"] == str(tmp_path / "secret")
    assert "TUNNEL_GATEWAY_SECRET" not in settings
    assert gateway.url_pattern() == "http://<id>-i.localhost:8080/"
    argv = " ".join(gateway.argv("http://127.0.0.1:8000"))
    assert "--ssh-listen 127.0.0.1:2222 --http-listen 127.0.0.1:8080" in argv


def test_a_users_gateway_is_the_agents_login_and_renters_ssh_is_off(tmp_path: Path) -> None:
    gateway = demo_gateway.DemoGateway(tmp_path, tmp_path / "secret", 2222, 8080, "alice")
    settings = gateway.hub_settings()
    assert settings["TUNNEL_GATEWAY_USER"] == "alice"
    assert settings["TUNNEL_GATEWAY_RENTER_USER"] == ""
    argv = gateway.argv("http://127.0.0.1:8000")
    assert argv[-6:] == ["--user", "alice", "--keys-command-user", "alice", "--renter-user", ""]
