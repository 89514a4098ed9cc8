from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from supplier_agent.protocol import (
    AGENT_TO_HUB,
    HUB_TO_AGENT,
    MAX_FRAME_BYTES,
    Ack,
    CacheVolume,
    ClaimState,
    DockerRun,
    GpuProcess,
    GpuState,
    Heartbeat,
    LogChunk,
    Logs,
    ProtocolError,
    Register,
    Release,
    Reserve,
    Welcome,
    encode,
    parse_gpu_selector,
    parse_message,
)

LEASE = str(uuid.uuid4())
COMMAND = str(uuid.uuid4())
GPU_UUID = "GPU-12345678-abcd-ef01-2345-6789abcdef01"


def _heartbeat(*, twice: bool = False, **gpu_fields: object) -> dict[str, object]:
    gpu = {
        "index": 0,
        "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        "name": "RTX",
        "memory_total_bytes": 1,
        "memory_used_bytes": 0,
        "utilization_pct": 0,
        **gpu_fields,
    }
    return {"type": "heartbeat", "v": 1, "gpus": [gpu, gpu] if twice else [gpu], "claims": []}


def _run(**fields: object) -> dict[str, object]:
    return {
        "type": "docker_run",
        "v": 1,
        "command_id": COMMAND,
        "lease_id": LEASE,
        "epoch": 1,
        "image": "busybox:latest",
        **fields,
    }


@pytest.mark.parametrize(
    "message",
    [
        Register(
            agent_id=str(uuid.uuid4()),
            hostname="gpu-box",
            os="Ubuntu 24.04",
            arch="x86_64",
            cpu_model="EPYC",
            cpu_count=64,
            ram_bytes=2**40,
            agent_version="0.1.0",
            runtime="docker",
            gpus=(
                GpuState(0, GPU_UUID, "H100", 80 * 2**30, 2**30, 12, (GpuProcess(7, "python", 9),)),
            ),
            claims=(ClaimState(LEASE, (0,), 3, "abc", {"8888": 40001}),),
        ),
        Heartbeat(),
        Ack(command_id=COMMAND, ok=False, error="image not found"),
        Welcome(host_id="h1", heartbeat_interval_s=15, desired_claims=(LEASE,)),
        Reserve(command_id=COMMAND, lease_id=LEASE, epoch=2, gpus="0,1"),
        DockerRun(
            command_id=COMMAND,
            lease_id=LEASE,
            epoch=2,
            image="ghcr.io/org/vllm:0.6.3",
            ports=(8000, 8888),
            env={"HF_HOME": "/cache"},
            command=("serve", "--port", "8000"),
            cache_volume=CacheVolume("hf", "/cache"),
            warmup=("curl", "-f", "http://127.0.0.1:8000/health"),
        ),
        Release(command_id=COMMAND, lease_id=LEASE, epoch=2, reason="renter_stop"),
        Logs(lease_id=LEASE, follow=True, tail=100),
        Logs(lease_id=LEASE, follow=False),
        LogChunk(lease_id=LEASE, seq=1_700_000_000_000, data="épocha 1 \ufffd\n\x1b[31mred\n"),
    ],
)
def test_every_message_survives_a_round_trip(message: object) -> None:
    assert parse_message(encode(message)) == message  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        ("[1, 2]", "must be a JSON object"),
        ('{"v": 1}', "no string 'type'"),
        ('{"type": "ack", "v": 2}', "unsupported protocol version 2"),
        ('{"type": "ping", "v": true}', "unsupported protocol version True"),
        ('{"type": "ping", "v": 1.0}', "unsupported protocol version 1.0"),
        (json.dumps(_heartbeat(memory_used_bytes=2**63)), "outside the 64-bit integer range"),
        (json.dumps(_heartbeat(name="RTX\u0000")), "contains a NUL character"),
        (json.dumps(_heartbeat(name="\ud800")), "lone surrogate"),
        (json.dumps(_heartbeat(twice=True)), "lists a GPU index twice"),
        ('{"type": "nope", "v": 1}', "unknown message type"),
        (json.dumps(_run(image="UPPER/Case")), "not a valid image reference"),
        (json.dumps(_run(image="busybox; rm -rf /")), "not a valid image reference"),
        (json.dumps(_run(ports=[0])), "at least 1"),
        (json.dumps(_run(ports=[65536])), "at most 65535"),
        (json.dumps(_run(ports=[True])), "not a boolean"),
        (json.dumps(_run(ports=[80, 80])), "lists a port twice"),
        (json.dumps(_run(env={"NVIDIA_VISIBLE_DEVICES": "all"})), "may not be set"),
        (json.dumps(_run(env={"LD_PRELOAD": "/x.so"})), "may not be set"),
        (json.dumps(_run(env={"1BAD": "x"})), "not a valid variable name"),
        (json.dumps(_run(user="root; id")), "docker_run.user"),
        (json.dumps(_run(cache_volume={"name": "hf", "path": "../etc"})), "absolute folder"),
        (json.dumps(_run(extra=1)), "unknown field(s) extra"),
        (json.dumps(_run(epoch=-1)), "epoch must be at least 0"),
        (json.dumps({"type": "logs", "v": 1, "lease_id": LEASE, "tail": 1001}), "at most 1000"),
        (json.dumps({"type": "logs", "v": 1, "lease_id": LEASE, "tail": -1}), "at least 0"),
        (json.dumps({"type": "logs", "v": 1, "lease_id": LEASE, "follow": 1}), "a boolean"),
        (json.dumps({"type": "logs", "v": 1, "lease_id": "x"}), "must be a UUID"),
        (
            json.dumps({"type": "log_chunk", "v": 1, "lease_id": LEASE, "seq": -1, "data": "x"}),
            "at least 0",
        ),
        (
            json.dumps({"type": "log_chunk", "v": 1, "lease_id": LEASE, "seq": 1, "data": 5}),
            "must be a string",
        ),
        (
            json.dumps({"type": "log_chunk", "v": 1, "lease_id": LEASE, "seq": 2**53, "data": "x"}),
            "at most",
        ),
        (
            # 6,000 three-byte characters: under the character limit, over 16 KiB of UTF-8.
            json.dumps(
                {"type": "log_chunk", "v": 1, "lease_id": LEASE, "seq": 1, "data": "€" * 6000},
                ensure_ascii=False,
            ),
            "larger than 16384 bytes",
        ),
    ],
)
def test_bad_frames_get_a_reason(frame: str, reason: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_message(frame)
    assert reason in str(caught.value)


def test_frames_over_64_kib_are_refused_before_parsing() -> None:
    frame = json.dumps({"type": "ping", "v": 1, "nonce": "x" * MAX_FRAME_BYTES})
    with pytest.raises(ProtocolError, match="larger than"):
        parse_message(frame)


def test_each_side_accepts_only_its_own_message_types() -> None:
    reserve = encode(Reserve(command_id=COMMAND, lease_id=LEASE, epoch=1, gpus="0"))
    assert isinstance(parse_message(reserve, allowed=HUB_TO_AGENT), Reserve)
    with pytest.raises(ProtocolError, match="unknown message type"):
        parse_message(reserve, allowed=AGENT_TO_HUB)
    logs = encode(Logs(lease_id=LEASE))
    chunk = encode(LogChunk(lease_id=LEASE, seq=1, data="x"))
    assert isinstance(parse_message(logs, allowed=HUB_TO_AGENT), Logs)
    assert isinstance(parse_message(chunk, allowed=AGENT_TO_HUB), LogChunk)
    with pytest.raises(ProtocolError, match="unknown message type"):
        parse_message(logs, allowed=AGENT_TO_HUB)
    with pytest.raises(ProtocolError, match="unknown message type"):
        parse_message(chunk, allowed=HUB_TO_AGENT)


@pytest.mark.parametrize(
    ("selector", "expected"),
    [("0", (0,)), ("3,1", (3, 1)), (GPU_UUID, (GPU_UUID,))],
)
def test_gpu_selectors(selector: str, expected: tuple[object, ...]) -> None:
    assert parse_gpu_selector(selector) == expected


@pytest.mark.parametrize(
    "selector",
    ["", "0,0", "64", ",".join(str(i) for i in range(65)), "0;1", "-1", "\uff10", "all", "GPU-xyz"],
)
def test_bad_gpu_selectors_are_refused(selector: str) -> None:
    with pytest.raises(ProtocolError):
        parse_gpu_selector(selector)


def test_the_machine_identity_is_a_hash_of_the_machine_id(tmp_path: Path) -> None:
    from supplier_agent.hostinfo import machine_identity

    (tmp_path / "machine-id").write_text("0123456789abcdef0123456789abcdef\n")

    identity = machine_identity((tmp_path / "missing", tmp_path / "machine-id"))

    assert len(identity) == 32
    assert "0123456789abcdef" not in identity  # the raw id stays on the host
    assert identity == machine_identity((tmp_path / "machine-id",))
    assert machine_identity((tmp_path / "missing",)) == ""
