"""The agent wheel the hub builds and serves: build cache, release manifest, download."""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from pathlib import Path

import pytest
from django.test import Client
from pytest_django.fixtures import SettingsWrapper

from hub.installer.services import (
    REPO_ROOT,
    WheelInfo,
    agent_version,
    build_agent_wheel,
    wheel_sources,
)


def test_the_wheel_holds_the_agent_package_at_the_tree_version(agent_wheel: WheelInfo) -> None:
    version = agent_version()
    assert agent_wheel.version == version
    assert agent_wheel.filename == f"cloudgpu_agent-{version}-py3-none-any.whl"
    assert agent_wheel.sha256 == hashlib.sha256(agent_wheel.path.read_bytes()).hexdigest()
    with zipfile.ZipFile(agent_wheel.path) as wheel:
        names = set(wheel.namelist())
        entry_points = wheel.read(f"cloudgpu_agent-{version}.dist-info/entry_points.txt")
    assert {"supplier_agent/cli.py", "supplier_agent/protocol.py"} <= names
    # Every module of the agent, so that one split out of another (protocol_*.py) or put in a
    # subpackage cannot be left out: the agent would fail to import on the supplier's host.
    modules = {
        p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "supplier_agent").rglob("*.py")
    }
    assert modules <= names, sorted(modules - names)
    assert b"cloudgpu-agent = supplier_agent.cli:main" in entry_points
    assert not any(name.startswith(("hub/", "tests/")) for name in names)


def test_an_unchanged_tree_is_built_once(agent_wheel: WheelInfo) -> None:
    before = agent_wheel.path.stat().st_mtime_ns
    again = build_agent_wheel(agent_wheel.path.parent.parent)
    assert again == agent_wheel
    assert again.path.stat().st_mtime_ns == before


def test_a_changed_tree_is_built_again(tmp_path: Path, agent_wheel: WheelInfo) -> None:
    source = tmp_path / "src"
    for name in wheel_sources(REPO_ROOT):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, source / name)
    dist = tmp_path / "dist"
    first = build_agent_wheel(dist, source_root=source)
    assert first.filename == agent_wheel.filename
    with (source / "supplier_agent" / "protocol.py").open("a") as f:
        f.write("\n# a change\n")
    second = build_agent_wheel(dist, source_root=source)
    assert second.path != first.path
    assert second.sha256 != first.sha256
    with zipfile.ZipFile(second.path) as wheel:
        assert wheel.read("supplier_agent/protocol.py").endswith(b"# a change\n")
    # The older build is gone: only the current one is ever served.
    assert not first.path.exists()


def test_release_json_describes_the_served_wheel(
    client: Client, settings: SettingsWrapper, agent_wheel: WheelInfo
) -> None:
    settings.AGENT_DIST_DIR = agent_wheel.path.parent.parent
    settings.HUB_PUBLIC_URL = "https://hub.example.com"
    response = client.get("/agent/release.json")
    assert response.status_code == 200
    assert response.json() == {
        "version": agent_wheel.version,
        "filename": agent_wheel.filename,
        "sha256": agent_wheel.sha256,
        "url": f"https://hub.example.com/agent/{agent_wheel.filename}",
    }
    wheel = client.get(f"/agent/{agent_wheel.filename}")
    assert wheel.status_code == 200
    assert b"".join(wheel.streaming_content) == agent_wheel.path.read_bytes()


@pytest.mark.parametrize(
    "filename", ["cloudgpu_agent-0.0.1-py3-none-any.whl", "..%2Frelease.whl", "other.whl"]
)
def test_only_the_current_wheel_is_served(
    client: Client, settings: SettingsWrapper, agent_wheel: WheelInfo, filename: str
) -> None:
    settings.AGENT_DIST_DIR = agent_wheel.path.parent.parent
    assert client.get(f"/agent/{filename}").status_code == 404


def test_the_script_is_served_as_shell_with_this_hubs_url(
    client: Client, settings: SettingsWrapper
) -> None:
    settings.HUB_PUBLIC_URL = "https://hub.example.com"
    response = client.get("/install.sh")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/x-shellscript")
    text = response.content.decode()
    assert "local hub=https://hub.example.com\n" in text
    assert text.rstrip("\n").splitlines()[-1] == 'main "$@" cloudgpu-install-end'


def test_the_wheel_is_built_on_first_request(
    client: Client, settings: SettingsWrapper, tmp_path: Path
) -> None:
    settings.AGENT_DIST_DIR = tmp_path / "dist"
    response = client.get("/agent/release.json")
    assert response.status_code == 200
    built = list((tmp_path / "dist").glob("*/*.whl"))
    assert [p.name for p in built] == [response.json()["filename"]]
