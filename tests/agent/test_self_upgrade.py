"""The agent's side of a hub rollout, without a hub: finding its installation, rolling the
prefix back, the messages' checks, and what it answers when it cannot take part. The whole of
it, with real agents and a real hub, is tests/e2e/test_rollout.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from supplier_agent import __version__
from supplier_agent.config import AgentConfig
from supplier_agent.protocol import (
    HUB_TO_AGENT,
    Message,
    ProtocolError,
    Rollback,
    Upgrade,
    UpgradeStatus,
    encode,
    parse_message,
)
from supplier_agent.self_upgrade import SelfUpgrader, installation
from supplier_agent.upgrade import ROLLBACK_RECORD, UpgradeError, rollback
from tests.support.loops import run_on_own_loop

ROLLOUT = "6f1c1c3e-1b1a-4f0e-9a51-2c3c1c1c1c1c"


def _prefix(tmp_path: Path, *versions: str) -> Path:
    """An installer's layout: venvs/<version>/bin/cloudgpu-agent, venv -> the last one."""
    prefix = tmp_path / "opt"
    for version in versions:
        agent = prefix / "venvs" / version / "bin" / "cloudgpu-agent"
        agent.parent.mkdir(parents=True)
        agent.write_text("#!/bin/sh\n")
    (prefix / "venv").symlink_to(Path("venvs") / versions[-1])
    return prefix


def test_an_installed_agent_finds_its_prefix_by_the_link_it_was_started_through(
    tmp_path: Path,
) -> None:
    prefix = _prefix(tmp_path, "0.3.0")
    found = installation(prefix / "venv" / "bin" / "cloudgpu-agent", environ={})
    assert found.prefix == prefix
    assert found.agent == prefix / "venv" / "bin" / "cloudgpu-agent"
    assert not found.systemd
    assert installation(found.agent, environ={"INVOCATION_ID": "abc"}).systemd


@pytest.mark.parametrize(
    "script",
    ["/src/.venv/bin/cloudgpu-agent", "/usr/bin/python3", "/opt/x/venv/bin/cloudgpu-agent"],
)
def test_an_agent_not_run_from_an_installer_s_prefix_says_it_cannot_upgrade_itself(
    script: str,
) -> None:
    with pytest.raises(RuntimeError, match=r"installer|no agent at"):
        installation(Path(script), environ={})


def test_rollback_points_the_link_at_the_recorded_version_once(tmp_path: Path) -> None:
    prefix = _prefix(tmp_path, "0.3.0", "99.0.1")
    record = {"version": "0.3.0", "path": str(prefix / "venvs" / "0.3.0")}
    (prefix / ROLLBACK_RECORD).write_text(json.dumps(record))
    with pytest.raises(UpgradeError, match=r"was 0\.3\.0, not 0\.2\.9"):
        rollback(prefix, "0.2.9")
    assert os.readlink(prefix / "venv") == "venvs/99.0.1"  # untouched
    assert rollback(prefix, "0.3.0") == prefix / "venvs" / "0.3.0"
    assert (prefix / "venv").resolve() == (prefix / "venvs" / "0.3.0").resolve()
    assert not (prefix / ROLLBACK_RECORD).exists()
    # The bad version stays until the next upgrade prunes it; a second rollback has no record.
    assert (prefix / "venvs" / "99.0.1").is_dir()
    with pytest.raises(UpgradeError, match="nothing to roll back to"):
        rollback(prefix, "0.3.0")


def test_rollback_to_a_folder_that_is_gone_changes_nothing(tmp_path: Path) -> None:
    prefix = _prefix(tmp_path, "99.0.1")
    record = {"version": "0.3.0", "path": str(prefix / "venvs" / "0.3.0")}
    (prefix / ROLLBACK_RECORD).write_text(json.dumps(record))
    with pytest.raises(UpgradeError, match="is gone"):
        rollback(prefix, "0.3.0")
    assert os.readlink(prefix / "venv") == "venvs/99.0.1"
    (prefix / ROLLBACK_RECORD).write_text("{not json")
    with pytest.raises(UpgradeError, match="cannot read"):
        rollback(prefix, "0.3.0")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"type": "upgrade", "rollout_id": ROLLOUT, "version": "../../etc"}, "not a version"),
        ({"type": "upgrade", "rollout_id": "x", "version": "1.0"}, "UUID"),
        ({"type": "upgrade", "rollout_id": ROLLOUT, "version": "1.0", "url": "x"}, "unknown"),
        ({"type": "rollback", "rollout_id": ROLLOUT, "version": ""}, "empty"),
        ({"type": "rollback", "rollout_id": ROLLOUT, "version": "1\x00"}, "version|NUL"),
    ],
)
def test_the_hub_s_rollout_messages_are_checked(body: dict[str, object], words: str) -> None:
    with pytest.raises(ProtocolError, match=words):
        parse_message(json.dumps({**body, "v": 1}), allowed=HUB_TO_AGENT)


def test_upgrade_status_is_checked_and_round_trips() -> None:
    status = UpgradeStatus(rollout_id=ROLLOUT, version="1.0", state="failed", detail="x" * 2000)
    assert parse_message(encode(status)) == status
    with pytest.raises(ProtocolError, match="one of"):
        parse_message(encode(UpgradeStatus(rollout_id=ROLLOUT, version="1.0", state="done")))
    with pytest.raises(ProtocolError, match="longer than"):
        UpgradeStatus.from_dict(
            {"rollout_id": ROLLOUT, "version": "1.0", "state": "failed", "detail": "x" * 2001}
        )
    # The agent does not take its own status from the hub, nor the hub's orders from an agent.
    with pytest.raises(ProtocolError, match="unknown message type"):
        parse_message(encode(status), allowed=HUB_TO_AGENT)


def _answers(message: Upgrade | Rollback, tmp_path: Path) -> list[Message]:
    sent: list[Message] = []
    config = AgentConfig(hub_url="http://127.0.0.1:1", token="t", state_dir=tmp_path)
    upgrader = SelfUpgrader(config, sent.append, lambda argv: sent.append(argv))  # type: ignore[arg-type]
    method = upgrader.upgrade if isinstance(message, Upgrade) else upgrader.rollback
    run_on_own_loop(method(message))  # type: ignore[arg-type]
    return sent


def test_an_agent_outside_an_installer_s_prefix_refuses_and_says_why(tmp_path: Path) -> None:
    # This test process is not <prefix>/venv/bin/cloudgpu-agent.
    for message in (
        Upgrade(rollout_id=ROLLOUT, version="99.0.0"),
        Rollback(rollout_id=ROLLOUT, version="0.0.1"),
    ):
        (answer,) = _answers(message, tmp_path)
        assert isinstance(answer, UpgradeStatus)
        assert answer.state == "refused"
        assert "upgrade it the way it was installed" in answer.detail


def test_an_agent_already_at_the_version_says_so_and_does_nothing(tmp_path: Path) -> None:
    (answer,) = _answers(Upgrade(rollout_id=ROLLOUT, version=__version__), tmp_path)
    assert isinstance(answer, UpgradeStatus)
    assert (answer.state, answer.detail) == ("switched", f"already runs version {__version__}")
    (answer,) = _answers(Rollback(rollout_id=ROLLOUT, version=__version__), tmp_path)
    assert isinstance(answer, UpgradeStatus)
    assert answer.state == "rolled_back"
