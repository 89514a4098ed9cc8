"""What the agent keeps and sends of a lease's output stays within its budgets (issue 23)."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supplier_agent import containers, logs
from supplier_agent.containers import ContainerRuntime
from supplier_agent.logs import LogPump
from supplier_agent.protocol import MAX_LOG_CHUNK_BYTES, DockerRun, LogChunk
from tests.support.agents import AGENT, agent_env, new_token
from tests.support.docker_cleanup import remove_containers
from tests.support.fake_gpus import fake_nvml_env
from tests.support.polling import wait_for


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _run(bursts: list[bytes], seconds: int) -> tuple[list[tuple[float, str]], int]:
    """Feed ``bursts`` at the start of every second (as Docker's stream hands them over, in
    pieces), flushing as the follower's ticker does; the chunks with their times, bytes fed."""
    clock = _Clock()
    sent: list[tuple[float, str]] = []
    pump = LogPump(lambda text: sent.append((clock.now, text)), clock=clock)
    fed = 0
    ticks_per_s = 20  # finer than the chunk rate: the pump, not the ticker, sets the pace
    for second in range(seconds):
        for tick in range(ticks_per_s):
            clock.now = 1000.0 + second + tick / ticks_per_s
            if tick == 0:
                for burst in bursts:
                    pump.feed(burst)
                    fed += len(burst)
            pump.flush()
    clock.now += 1
    pump.flush(final=True)
    return sent, fed


def test_a_burst_within_the_byte_budget_is_not_dropped() -> None:
    # 64 KiB once a second, in 8 KiB reads: exactly the byte budget, far from a flood.
    burst = [b"y" * 8191 + b"\n"] * 8
    assert sum(map(len, burst)) == logs.BYTES_PER_S

    sent, fed = _run(burst, seconds=10)

    text = "".join(data for _, data in sent)
    assert "dropped" not in text
    assert len(text) == fed


def test_chunks_stay_within_the_frame_and_the_chunk_rate() -> None:
    sent, _ = _run([b"z" * 8192] * 8, seconds=5)

    assert all(len(data.encode()) <= MAX_LOG_CHUNK_BYTES for _, data in sent)
    for second in range(5):
        in_second = [at for at, _ in sent if 1000 + second <= at < 1001 + second]
        assert len(in_second) <= logs.CHUNKS_PER_S


def test_a_flood_is_cut_to_the_byte_budget_with_a_marker() -> None:
    # Ten times the budget every second.
    sent, fed = _run([b"f" * 8192] * 80, seconds=5)

    text = "".join(data for _, data in sent)
    assert "bytes dropped ...]" in text
    kept = text.count("f")
    assert kept <= logs.BYTES_PER_S * 6
    dropped = sum(int(part.split(" bytes dropped")[0]) for part in text.split("[... ")[1:])
    assert kept + dropped == fed


def test_a_stream_sends_output_as_it_comes_and_flushes_the_rest_at_its_end() -> None:
    # The warm-up's output (issue 21 item 2): chunks leave while the block runs, as a
    # follower's would, with the lease's id and growing seqs; what waits leaves at the end.
    sent: list[LogChunk] = []
    followers = logs.LogFollowers(_NoSource(), sent.append, lambda lease, reason: None)
    lease_id = str(uuid.uuid4())

    with followers.streaming(lease_id) as sink:
        sink(b"first line\n")
        wait_for(lambda: sent, timeout_s=10, what="a chunk while the stream is open")
        assert [chunk.data for chunk in sent] == ["first line\n"]
        sink("caf\u00e9".encode()[:-1])  # half a character: it waits for its other half
        sink("\u00e9".encode()[-1:] + b" last")

    assert "".join(chunk.data for chunk in sent) == "first line\ncaf\u00e9 last"
    assert {chunk.lease_id for chunk in sent} == {lease_id}
    assert [chunk.seq for chunk in sent] == sorted({chunk.seq for chunk in sent})
    assert followers.following() == set()  # no follower was started or left behind


def test_a_flooding_stream_keeps_the_byte_budget() -> None:
    sent: list[LogChunk] = []
    followers = logs.LogFollowers(_NoSource(), sent.append, lambda lease, reason: None)

    began = time.monotonic()
    with followers.streaming(str(uuid.uuid4())) as sink:
        for _ in range(64):
            sink(b"y" * 16384)  # 1 MiB at once, far over a second's budget
    took_s = time.monotonic() - began

    text = "".join(chunk.data for chunk in sent)
    # One second's budget at once, then the budget's rate for the time the feeding took.
    assert text.count("y") <= logs.BYTES_PER_S * (1 + took_s)
    assert text.count("y") < 2 * logs.BYTES_PER_S
    assert "bytes dropped" in text
    assert all(len(chunk.data.encode()) <= MAX_LOG_CHUNK_BYTES for chunk in sent)


class _NoSource:
    def follow_logs(self, lease_id: str, tail: int, sink: Any, stop: Any) -> None:
        raise AssertionError("a stream follows no container")


def test_control_characters_are_counted_as_they_travel() -> None:
    # Each \x01 costs six bytes escaped in JSON: chunks still fit the frame.
    sent, fed = _run([b"\x01" * 8192] * 4, seconds=2)

    assert all(logs._escaped_size(data) <= MAX_LOG_CHUNK_BYTES for _, data in sent)
    assert sum(len(data) for _, data in sent) == fed


# --- Docker's copy of the output, on the supplier's disk -------------------------------------

# About 8 MiB of output, then a last line; the container stays up like a rental would.
CHATTY = (
    "i=0; while [ $i -lt 128 ]; do head -c 65535 /dev/zero | tr '\\0' x; echo; i=$((i+1)); done;"
    " echo last line; exec sleep 600"
)


@pytest.fixture
def agent_id(docker_client: Any) -> Iterator[str]:
    agent = str(uuid.uuid4())
    yield agent
    remove_containers(docker_client, {"label": f"cloudgpu.claim={agent}"})


def _spec(image: str, command: str) -> DockerRun:
    return DockerRun(
        command_id=str(uuid.uuid4()),
        lease_id=str(uuid.uuid4()),
        epoch=1,
        image=image,
        ports=(),
        command=("sh", "-c", command),
    )


def _disk_bytes(docker_client: Any, container_id: str) -> int:
    """What the container's folder under Docker's root holds: its logs, whatever the driver."""
    root = Path(docker_client.info()["DockerRootDir"]) / "containers" / container_id
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file())


def test_a_chatty_lease_keeps_at_most_its_log_budget_on_disk(
    docker_client: Any, busybox_image: str, agent_id: str
) -> None:
    budget = 1024 * 1024
    runtime = ContainerRuntime(
        docker_client,
        gpu_devices="none",
        stop_grace_s=1,
        log_max_bytes=budget,
        allow_local_images=True,
    )
    spec = _spec(busybox_image, CHATTY)
    result = runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)

    def last_lines() -> str | None:
        raw = docker_client.api.logs(result.container_id, stdout=True, stderr=True, tail=3)
        return raw.decode() if b"last line" in raw else None

    # The newest output, what the exit tail and a new follower read, is still there.
    assert "last line" in wait_for(last_lines, timeout_s=60, what="the last line")
    # Docker's own files beside the logs (config, hosts, resolv.conf) take a few KiB.
    assert _disk_bytes(docker_client, result.container_id) <= budget + 64 * 1024


def test_every_lease_container_has_bounded_rotated_logs(
    docker_client: Any, busybox_image: str, agent_id: str
) -> None:
    runtime = ContainerRuntime(
        docker_client, gpu_devices="none", stop_grace_s=1, allow_local_images=True
    )
    spec = _spec(busybox_image, "exec sleep 600")
    result = runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)

    config = docker_client.api.inspect_container(result.container_id)["HostConfig"]["LogConfig"]
    assert config["Type"] == "local"
    files = int(config["Config"]["max-file"])
    per_file_kib = int(config["Config"]["max-size"].removesuffix("k"))
    assert files * per_file_kib * 1024 == containers.CONTAINER_LOG_MIB * 1024 * 1024


def test_doctor_warns_when_dockers_disk_is_below_the_floor(
    docker_client: Any, tmp_path: Path
) -> None:
    # A floor no disk reaches: the row must warn, with what to do, and not fail the host.
    env = agent_env(
        CLOUDGPU_HUB="http://127.0.0.1:9",
        CLOUDGPU_TOKEN=new_token(),
        CLOUDGPU_STATE_DIR=str(tmp_path / "state"),
        CLOUDGPU_DISK_FLOOR_GIB="1000000",
        **fake_nvml_env(tmp_path / "no-such-table.json"),
    )
    result = subprocess.run(
        [AGENT, "doctor"], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    row = next(line for line in result.stdout.splitlines() if line.startswith("docker disk "))
    assert row.split()[2] == "warn", result.stdout + result.stderr
    assert "below the floor of 1e+06 GiB" in row
    assert result.returncode == 0, result.stdout
