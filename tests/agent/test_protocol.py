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
    RenterVolume,
    Reserve,
    VolumeDelete,
    VolumeRemoval,
    VolumeReport,
    VolumeUsage,
    Welcome,
    encode,
    parse_gpu_selector,
    parse_message,
)

# Fixed, not random: they appear in parametrized test ids, which must be the same in every
# pytest-xdist worker's collection.
LEASE = "1929887f-bcd9-44c5-a6e6-5e40601a8b0a"
COMMAND = "50dd75a5-e4ea-4fb5-bb45-c90109085d36"
GPU_UUID = "GPU-12345678-abcd-ef01-2345-6789abcdef01"
VOL = "vol-" + "a" * 40
VOL2 = "vol-" + "0123456789" * 4
CACHE = "renter-" + "b" * 40


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
        DockerRun(
            command_id=COMMAND,
            lease_id=LEASE,
            epoch=2,
            image="busybox:latest",
            cache_volume=CacheVolume(CACHE, "/cache"),
            volumes=(RenterVolume(VOL, "/data", 100 * 2**30), RenterVolume(VOL2, "/scratch")),
        ),
        Release(command_id=COMMAND, lease_id=LEASE, epoch=2, reason="renter_stop"),
        VolumeReport(
            volumes=(
                VolumeUsage(VOL, 2**40, True, 1_700_000_000.25, True),
                VolumeUsage(CACHE, -1, False, 1_700_000_000.0),
            ),
            removed=(
                VolumeRemoval(VOL2, "deleted", 1_700_000_001.5),
                VolumeRemoval("renter-" + "c" * 40, "idle", 1_700_000_002.0),
                VolumeRemoval("vol-" + "d" * 40, "disk_low", 1_700_000_003.0),
            ),
        ),
        VolumeReport(),
        VolumeDelete(name=VOL),
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


def _volume(**fields: object) -> dict[str, object]:
    return {"name": VOL, "path": "/data", **fields}


def _report(volumes: object = (), removed: object = (), **fields: object) -> str:
    body = {"type": "volume_report", "v": 1, "volumes": volumes, "removed": removed, **fields}
    return json.dumps(body, default=list)


def _usage(**fields: object) -> dict[str, object]:
    return {"name": VOL, "bytes": 1, "in_use": False, "last_used": 1.5e9, **fields}


def _removal(**fields: object) -> dict[str, object]:
    return {"name": VOL, "reason": "idle", "at": 1.5e9, **fields}


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (json.dumps(_run(volumes=[_volume(name="vol-" + "A" * 40)])), "40 lowercase hex"),
        (json.dumps(_run(volumes=[_volume(name="vol-" + "a" * 39)])), "40 lowercase hex"),
        (json.dumps(_run(volumes=[_volume(name=CACHE)])), "40 lowercase hex"),
        (json.dumps(_run(volumes=[_volume(name=VOL + "\n")])), "40 lowercase hex"),
        (json.dumps(_run(volumes=[_volume(name=VOL + "\u0000")])), "NUL"),
        (json.dumps(_run(volumes=[_volume(path="/")])), "absolute folder"),
        (json.dumps(_run(volumes=[_volume(path="data")])), "absolute folder"),
        (json.dumps(_run(volumes=[_volume(path="/data/../etc")])), "absolute folder"),
        (json.dumps(_run(volumes=[_volume(path="/d\ud800")])), "lone surrogate"),
        (json.dumps(_run(volumes=[_volume(size_bytes=0)])), "at least 1"),
        (json.dumps(_run(volumes=[_volume(size_bytes=2**62 + 1)])), "at most"),
        (json.dumps(_run(volumes=[_volume(size_bytes=2**63)])), "64-bit integer range"),
        (json.dumps(_run(volumes=[_volume(size_bytes=1.5)])), "an integer"),
        (json.dumps(_run(volumes=[_volume(size_bytes=True)])), "not a boolean"),
        (json.dumps(_run(volumes=[_volume(extra=1)])), "unknown field(s) extra"),
        (json.dumps(_run(volumes=[_volume(), _volume(path="/other")])), "lists a volume twice"),
        (json.dumps(_run(volumes=[_volume(), _volume(name=VOL2)])), "share a path"),
        (json.dumps(_run(volumes=[_volume(), _volume(name=VOL2, path="/data/")])), "normal form"),
        (
            json.dumps(
                _run(
                    cache_volume={"name": CACHE, "path": "/data"},
                    volumes=[_volume()],
                )
            ),
            "share a path",
        ),
        (
            json.dumps(
                _run(volumes=[_volume(name=f"vol-{i:040x}", path=f"/d{i}") for i in range(5)])
            ),
            "more than 4 items",
        ),
        (json.dumps(_run(volumes={"name": VOL})), "must be a list"),
        (_report([_usage(name="renter-" + "b" * 41)]), "40 lowercase hex"),
        (_report([_usage(name="cloudgpu-vol-" + "a" * 40)]), "40 lowercase hex"),
        (_report([_usage(bytes=-2)]), "at least -1"),
        (_report([_usage(bytes=2**63)]), "64-bit integer range"),
        (_report([_usage(bytes=None)]), "an integer"),
        (_report([_usage(in_use=1)]), "a boolean"),
        (_report([_usage(over_cap="no")]), "a boolean"),
        (_report([_usage(last_used=-1)]), "Unix seconds"),
        (_report([_usage(last_used=1e12)]), "Unix seconds"),
        (_report([_usage(last_used=True)]), "not a boolean"),
        (_report([_usage(last_used="2025-01-01")]), "a number"),
        (_report([_usage(extra=1)]), "unknown field(s) extra"),
        (_report([_usage(), _usage()]), "lists a volume twice"),
        (_report(removed=[_removal(reason="full")]), "reason must be one of"),
        (_report(removed=[_removal(reason="idle\u0000")]), "NUL"),
        (_report(removed=[_removal(at=float("nan"))]), "Unix seconds"),
        (_report(removed=[_removal(at=float("inf"))]), "Unix seconds"),
        (_report(removed=[_removal(name="\ud800")]), "lone surrogate"),
        (_report(removed=[_removal(), _removal(reason="deleted")]), "lists a volume twice"),
        (_report(removed=[_removal(when=1)]), "unknown field(s) when"),
        (_report(extra=[]), "unknown field(s) extra"),
        (json.dumps({"type": "volume_delete", "v": 1, "name": CACHE}), "40 lowercase hex"),
        (json.dumps({"type": "volume_delete", "v": 1}), "must be a string"),
        (json.dumps({"type": "volume_delete", "v": 1, "name": VOL, "x": 1}), "unknown field"),
    ],
)
def test_bad_volume_frames_get_a_reason(frame: str, reason: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_message(frame)
    assert reason in str(caught.value)


def test_frames_over_64_kib_are_refused_before_parsing() -> None:
    frame = json.dumps({"type": "ping", "v": 1, "nonce": "x" * MAX_FRAME_BYTES})
    with pytest.raises(ProtocolError, match="larger than"):
        parse_message(frame)


def test_a_report_lists_at_most_4096_volumes() -> None:
    # Past the frame limit on the wire; the bound still holds for a report built in code.
    usages = [_usage(name=f"vol-{i:040x}") for i in range(4097)]
    with pytest.raises(ProtocolError, match="more than 4096 items"):
        VolumeReport.from_dict({"volumes": usages})
    assert len(VolumeReport.from_dict({"volumes": usages[:4096]}).volumes) == 4096


def test_docker_run_without_volumes_leaves_them_out_of_the_frame() -> None:
    # An agent from before renter volumes refuses unknown fields: a newer hub's plain
    # docker_run must still look like what it knows.
    plain = json.loads(encode(DockerRun(command_id=COMMAND, lease_id=LEASE, epoch=1, image="a")))
    assert "volumes" not in plain
    assert parse_message(json.dumps(plain)).volumes == ()  # type: ignore[attr-defined]


def test_a_renter_volume_without_a_cap_parses_with_or_without_the_key() -> None:
    for volume in ({"name": VOL, "path": "/data"}, {"name": VOL, "path": "/d", "size_bytes": None}):
        message = parse_message(json.dumps(_run(volumes=[volume])))
        assert message.volumes[0].size_bytes is None  # type: ignore[attr-defined]


def test_report_times_and_defaults() -> None:
    report = parse_message(_report([{"name": VOL, "bytes": -1, "in_use": True, "last_used": 7}]))
    assert report == VolumeReport(volumes=(VolumeUsage(VOL, -1, True, 7.0, False),))
    assert isinstance(report.volumes[0].last_used, float)  # type: ignore[attr-defined]


def test_volume_frames_go_one_way_each() -> None:
    report, delete = encode(VolumeReport()), encode(VolumeDelete(name=VOL))
    assert isinstance(parse_message(report, allowed=AGENT_TO_HUB), VolumeReport)
    assert isinstance(parse_message(delete, allowed=HUB_TO_AGENT), VolumeDelete)
    with pytest.raises(ProtocolError, match="unknown message type"):
        parse_message(report, allowed=HUB_TO_AGENT)
    with pytest.raises(ProtocolError, match="unknown message type"):
        parse_message(delete, allowed=AGENT_TO_HUB)


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
