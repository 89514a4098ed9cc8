"""The nginx in front of several web processes (`--web N`, hub/lib/web_proxy.py): its
configuration passes nginx's own check and says what the proxy promises."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hub.lib import web_proxy


def test_the_proxy_spreads_over_the_ports_after_its_own() -> None:
    proxy = web_proxy.WebProxy(Path("/tmp/x"), "127.0.0.1", 8000, (8001, 8002, 8003))
    config = proxy.config()
    assert "listen 127.0.0.1:8000;" in config
    for port in (8001, 8002, 8003):
        assert f"server 127.0.0.1:{port} max_fails=0;" in config
    assert "least_conn;" in config  # a restarted process takes the returning agents


def test_the_client_address_is_the_one_nginx_saw_never_the_clients_own_header() -> None:
    config = web_proxy.WebProxy(Path("/tmp/x"), "127.0.0.1", 8000, (8001, 8002)).config()
    assert "proxy_set_header X-Forwarded-For $remote_addr;" in config
    assert "$proxy_add_x_forwarded_for" not in config  # that appends to what the client sent


def test_plan_takes_the_ports_right_after_the_hubs(tmp_path: Path) -> None:
    if shutil.which("nginx") is None:
        pytest.skip("nginx is not installed (nginx-light)")
    proxy = web_proxy.plan(tmp_path, "127.0.0.1", 9000, 2)
    assert proxy.upstream_ports == (9001, 9002)


def test_plan_says_what_to_install_without_nginx(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(web_proxy.shutil, "which", lambda name: None)
    with pytest.raises(web_proxy.ProxyUnavailable, match="nginx-light"):
        web_proxy.plan(tmp_path, "127.0.0.1", 9000, 2)


def test_one_process_needs_no_proxy(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="two web processes"):
        web_proxy.plan(tmp_path, "127.0.0.1", 9000, 1)


def test_nginx_accepts_the_written_configuration(tmp_path: Path) -> None:
    if shutil.which("nginx") is None:
        pytest.skip("nginx is not installed (nginx-light)")
    proxy = web_proxy.WebProxy(tmp_path, "127.0.0.1", 8000, (8001, 8002))
    path = proxy.write()
    checked = subprocess.run(
        ["nginx", "-e", "stderr", "-t", "-q", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr
