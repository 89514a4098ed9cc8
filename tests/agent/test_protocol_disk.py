"""The protocol's part of the disk allowance (issue 33 item 1): the hub's allowance in
``docker_run``, the agent's stop cause in ``container_exited`` and its ``lease_notice``, each
checked as strictly as the rest, and left out of frames older peers would refuse."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from supplier_agent.protocol import (
    AGENT_TO_HUB,
    MAX_DISK_ALLOWANCE_BYTES,
    ContainerExited,
    DockerRun,
    LeaseNotice,
    ProtocolError,
    encode,
    parse_message,
)

LEASE = str(uuid.uuid4())


def _frame(**body: Any) -> str:
    return json.dumps({"v": 1, **body})


def _run(**extra: Any) -> str:
    return _frame(
        type="docker_run",
        command_id=str(uuid.uuid4()),
        lease_id=LEASE,
        epoch=1,
        image="busybox:latest",
        **extra,
    )


def test_docker_run_carries_the_allowance_and_leaves_it_out_when_unset() -> None:
    message = parse_message(_run(disk_allowance_bytes=50 * 1024**3))
    assert isinstance(message, DockerRun)
    assert message.disk_allowance_bytes == 50 * 1024**3
    assert parse_message(encode(message)) == message

    unset = DockerRun(command_id=str(uuid.uuid4()), lease_id=LEASE, epoch=1, image="busybox")
    assert "disk_allowance_bytes" not in json.loads(encode(unset))  # older agents refuse it


@pytest.mark.parametrize("value", [0, -1, MAX_DISK_ALLOWANCE_BYTES + 1, "1000", 1.5, True, 2**70])
def test_a_bad_allowance_is_refused_with_its_field(value: object) -> None:
    with pytest.raises(ProtocolError, match="disk_allowance_bytes"):
        parse_message(_run(disk_allowance_bytes=value))


def test_container_exited_carries_the_agents_stop_and_leaves_it_out_when_none() -> None:
    stopped = ContainerExited(
        lease_id=LEASE,
        exit_code=137,
        stop_cause="disk_allowance",
        stop_reason="stopped: it wrote 1.2 GiB, over its allowance of 1.0 GiB",
    )
    assert parse_message(encode(stopped)) == stopped

    ordinary = ContainerExited(lease_id=LEASE, exit_code=0)
    body = json.loads(encode(ordinary))
    assert "stop_cause" not in body  # hubs from before it refuse unknown fields
    assert "stop_reason" not in body


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"stop_cause": "bored"}, "stop_cause"),
        ({"stop_cause": 1}, "stop_cause"),
        ({"stop_cause": "disk_floor", "stop_reason": "x" * 501}, "stop_reason"),
        ({"stop_cause": "disk_floor", "stop_reason": "a\x00b"}, "stop_reason"),
    ],
)
def test_a_bad_stop_is_refused(extra: dict[str, Any], why: str) -> None:
    with pytest.raises(ProtocolError, match=why):
        parse_message(_frame(type="container_exited", lease_id=LEASE, exit_code=137, **extra))


def test_lease_notice_is_an_agent_message_checked_like_the_rest() -> None:
    assert "lease_notice" in AGENT_TO_HUB
    notice = LeaseNotice(lease_id=LEASE, text="disk nearly full: 460 MiB of 512 MiB")
    assert parse_message(encode(notice), allowed=AGENT_TO_HUB) == notice
    for bad in (
        {"lease_id": "not-a-uuid", "text": "x"},
        {"lease_id": LEASE, "text": ""},
        {"lease_id": LEASE, "text": "x" * 501},
        {"lease_id": LEASE, "text": "\ud800"},
        {"lease_id": LEASE, "text": "x", "extra": 1},
    ):
        with pytest.raises(ProtocolError):
            parse_message(_frame(type="lease_notice", **bad))
