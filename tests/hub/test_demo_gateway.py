"""The local trial's gateway plan (hub/lib/demo_gateway.py): where it cannot run, it says why
and which Debian packages to install, and the runner goes on without it."""

from __future__ import annotations

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


def test_a_folder_others_may_write_to_is_refused(tmp_path: Path) -> None:
    if demo_gateway.missing_packages():
        pytest.skip(f"not installed: {demo_gateway.missing_packages()}")
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    state = shared / "state"
    state.mkdir()
    with pytest.raises(demo_gateway.GatewayUnavailable, match="writable by its owner only"):
        demo_gateway.plan(state, 0, 0)


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
