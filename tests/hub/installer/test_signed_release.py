"""What the hub serves as the agent release when releases are signed (issue 37): a folder
signed away from the hub, served as it is; or the hub's own build signed with a key file;
and the install commands that pin the keys."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.test import Client
from pytest_django.fixtures import SettingsWrapper

from hub.installer import releases
from hub.installer.services import WheelInfo
from hub.web.views.supplier import install_command, prompt_install_command
from supplier_agent import release_signing

pytestmark = pytest.mark.django_db


def _signed_folder(tmp_path: Path, wheel: WheelInfo) -> tuple[Path, Ed25519PrivateKey]:
    folder = tmp_path / "release"
    folder.mkdir()
    shutil.copy(wheel.path, folder / wheel.filename)
    key = release_signing.write_private_key(tmp_path / "key.pem")
    described = release_signing.sign_release(folder / wheel.filename, key)
    (folder / release_signing.RELEASE_FILE).write_text(json.dumps(described))
    return folder, key


def _checks(description: dict[str, object], key: Ed25519PrivateKey) -> str:
    return release_signing.verify(
        str(description["version"]),
        str(description["filename"]),
        str(description["sha256"]),
        list(description["next_keys"]),  # type: ignore[call-overload]
        list(description["signatures"]),  # type: ignore[call-overload]
        [release_signing.public_key_text(key.public_key())],
    )


def test_a_folder_signed_away_from_the_hub_is_served_as_it_is(
    client: Client, settings: SettingsWrapper, agent_wheel: WheelInfo, tmp_path: Path
) -> None:
    folder, key = _signed_folder(tmp_path, agent_wheel)
    settings.AGENT_RELEASE_DIR = str(folder)
    settings.AGENT_DIST_DIR = tmp_path / "never-built"
    settings.HUB_PUBLIC_URL = "https://hub.example.com"
    served = client.get("/agent/release.json").json()
    assert served["url"] == f"https://hub.example.com/agent/{agent_wheel.filename}"
    assert _checks(served, key)
    wheel = client.get(f"/agent/{agent_wheel.filename}")
    assert b"".join(wheel.streaming_content) == agent_wheel.path.read_bytes()
    assert not (tmp_path / "never-built").exists()  # the hub built nothing of its own


def test_a_broken_release_folder_is_a_503_not_a_release(
    client: Client, settings: SettingsWrapper, tmp_path: Path
) -> None:
    settings.AGENT_RELEASE_DIR = str(tmp_path / "missing")
    assert client.get("/agent/release.json").status_code == 503
    folder = tmp_path / "escape"
    folder.mkdir()
    (folder / "release.json").write_text(json.dumps({"filename": "../../etc/passwd"}))
    settings.AGENT_RELEASE_DIR = str(folder)
    assert client.get("/agent/release.json").status_code == 503


def test_the_hubs_own_build_is_signed_with_a_key_file_and_its_key_pinned(
    client: Client, settings: SettingsWrapper, agent_wheel: WheelInfo, tmp_path: Path
) -> None:
    key = release_signing.write_private_key(tmp_path / "dev.pem")
    settings.AGENT_DIST_DIR = agent_wheel.path.parent.parent
    settings.AGENT_RELEASE_SIGNING_KEY_FILE = str(tmp_path / "dev.pem")
    settings.HUB_PUBLIC_URL = "https://hub.example.com"
    releases._signing_key.cache_clear()
    served = client.get("/agent/release.json").json()
    assert served["sha256"] == agent_wheel.sha256
    assert _checks(served, key)
    public = release_signing.public_key_text(key.public_key())
    assert install_command("cgpe_x").endswith(f"bash -s cgpe_x --release-key {public}")
    assert prompt_install_command().endswith(f"bash -s -- --release-key {public}")


def test_without_signing_nothing_is_pinned_and_the_commands_are_as_before(
    settings: SettingsWrapper,
) -> None:
    settings.HUB_PUBLIC_URL = "https://hub.example.com"
    assert (
        install_command("cgpe_x")
        == "curl -fsSL https://hub.example.com/install.sh | sudo bash -s cgpe_x"
    )
    assert prompt_install_command() == "curl -fsSL https://hub.example.com/install.sh | sudo bash"


def test_public_keys_named_in_settings_are_the_ones_pinned(settings: SettingsWrapper) -> None:
    keys = [
        release_signing.public_key_text(Ed25519PrivateKey.generate().public_key()) for _ in "ab"
    ]
    settings.AGENT_RELEASE_PUBLIC_KEYS = keys
    assert releases.pinned_keys() == tuple(keys)
    assert install_command("cgpe_x").endswith(f"--release-key {keys[0]} --release-key {keys[1]}")
