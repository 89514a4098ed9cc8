"""Real agent processes with the Docker runtime: real Docker engine, real flock, fake NVML
(the only fake), driven by a protocol peer on loopback."""

from __future__ import annotations

import fcntl
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors
import httpx
import pytest
from docker.errors import NotFound

from tests.support import control_plane
from tests.support.agents import agent_env, configure, new_token, running_agent
from tests.support.docker_cleanup import remove_containers, remove_volume
from tests.support.fake_gpus import FakeGpuTable, fake_nvml_env
from tests.support.hub_peer import HubPeer, PeerConnection
from tests.support.polling import wait_for

pytestmark = pytest.mark.docker

COMPUTE_MODE_DEFAULT, COMPUTE_MODE_EXCLUSIVE_PROCESS = 0, 3


def _httpd(marker: str) -> list[str]:
    return [
        "sh",
        "-c",
        f"mkdir -p /www && echo {marker} > /www/index.html && exec httpd -f -p 8080 -h /www",
    ]


@dataclass
class Host:
    """One simulated GPU host: a fake NVML table and a lock folder that agents share."""

    table: FakeGpuTable
    lock_dir: Path
    root: Path

    def env(self) -> dict[str, str]:
        return agent_env(**fake_nvml_env(self.table.path))

    def configure_agent(self, name: str, hub: HubPeer, *extra: str) -> Path:
        state = self.root / name
        result = configure(
            state,
            hub.url,
            hub.token,
            "--runtime",
            "docker",
            "--gpu-devices",
            "none",  # no NVIDIA runtime here; test_containers checks the device request
            "--lock-dir",
            str(self.lock_dir),
            "--allow-local-images",  # no registry here: the test images are built locally
            *extra,
            env=self.env(),
        )
        assert result.returncode == 0, result.stderr
        return state

    def lock_is_free(self, index: int) -> bool:
        with open(self.lock_dir / f"cloudgpu-gpu-{index}.lock", "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(handle, fcntl.LOCK_UN)
            return True


@pytest.fixture
def host(tmp_path: Path) -> Host:
    lock_dir = tmp_path / "locks"
    lock_dir.mkdir()
    return Host(FakeGpuTable.create(tmp_path / "gpus.json", gpu_count=2), lock_dir, tmp_path)


@pytest.fixture
def lease_cleanup(docker_client: object) -> Iterator[list[str]]:
    leases: list[str] = []
    yield leases
    for lease in leases:
        remove_containers(docker_client, {"label": f"cloudgpu.lease={lease}"})


def _containers(docker_client: object, lease: str) -> list[object]:
    return control_plane.containers(docker_client, lease)


@contextmanager
def _agent(
    host: Host, hub: HubPeer, name: str, log: Path
) -> Iterator[tuple[object, PeerConnection]]:
    state = host.root / name
    if not (state / "cloudgpu-agent.conf").exists():
        host.configure_agent(name, hub)
    count = len(hub.connections) + 1
    with running_agent(state, log, env=host.env()) as process:
        conn = hub.wait_for_connection(count=count, timeout_s=60)
        hub.wait_for(conn, "register")
        yield process, conn


def test_a_lease_runs_and_release_cleans_up_in_order(
    host: Host, docker_client: object, busybox_image: str, lease_cleanup: list[str], tmp_path: Path
) -> None:
    lease = str(uuid.uuid4())
    lease_cleanup.append(lease)
    marker = uuid.uuid4().hex
    with HubPeer(new_token()) as hub, _agent(host, hub, "a", tmp_path / "a.log") as (_, conn):
        reserved = hub.command(conn, "reserve", lease, 1, gpus="1")
        assert reserved.ok, reserved.error
        assert host.table.compute_mode(1) == COMPUTE_MODE_EXCLUSIVE_PROCESS
        assert not host.lock_is_free(1)

        started = hub.command(
            conn, "docker_run", lease, 1, image=busybox_image, ports=[8080], command=_httpd(marker)
        )
        assert started.ok, started.error
        port = started.result["ports"]["8080"]
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).text.strip() == marker

        released = hub.command(conn, "release", lease, 1, reason="renter_stop")
        assert released.ok, released.error
        assert _containers(docker_client, lease) == []
        assert host.table.compute_mode(1) == COMPUTE_MODE_DEFAULT
        assert host.lock_is_free(1)


def test_register_reports_free_disk_the_driver_and_its_cuda_version(
    host: Host, docker_client: object, tmp_path: Path
) -> None:
    """Issue 20 item 3: what renters choose a host by, measured by the agent (NVML's driver
    and CUDA versions, statvfs of Docker's root), in the register frame."""
    with HubPeer(new_token()) as hub, _agent(host, hub, "facts", tmp_path / "f.log") as (_, conn):
        register = hub.wait_for(conn, "register")
        assert register.driver_version == "570.86.15"
        assert register.cuda_version == "12.8"
        assert register.disk_free_bytes is not None
        assert register.disk_free_bytes > 0


def test_two_agents_race_for_gpu_0_and_exactly_one_wins(host: Host, tmp_path: Path) -> None:
    with HubPeer(new_token()) as hub, ExitStack() as stack:
        _, conn_a = stack.enter_context(_agent(host, hub, "a", tmp_path / "a.log"))
        _, conn_b = stack.enter_context(_agent(host, hub, "b", tmp_path / "b.log"))
        lease_a, lease_b = str(uuid.uuid4()), str(uuid.uuid4())
        ids = {conn_a: str(uuid.uuid4()), conn_b: str(uuid.uuid4())}
        # Both commands go out before either answer is read: the agents really race.
        for conn, lease in ((conn_a, lease_a), (conn_b, lease_b)):
            hub.send(
                conn,
                {
                    "type": "reserve",
                    "command_id": ids[conn],
                    "lease_id": lease,
                    "epoch": 1,
                    "gpus": "0",
                },
            )
        ack_a = hub.wait_for(conn_a, "ack", lambda m: m.command_id == ids[conn_a])
        ack_b = hub.wait_for(conn_b, "ack", lambda m: m.command_id == ids[conn_b])
        assert [ack_a.ok, ack_b.ok].count(True) == 1
        loser, winner_lease = (ack_b, lease_a) if ack_a.ok else (ack_a, lease_b)
        assert winner_lease in loser.error
        winner_state = host.root / ("a" if ack_a.ok else "b")
        assert (winner_state / "agent_id").read_text().strip() in loser.error


def test_a_foreign_compute_process_makes_reserve_fail_with_its_name(
    host: Host, tmp_path: Path
) -> None:
    host.table.add_process(0, pid=4242, name="other-platform-job")
    with HubPeer(new_token()) as hub, _agent(host, hub, "a", tmp_path / "a.log") as (_, conn):
        refused = hub.command(conn, "reserve", str(uuid.uuid4()), 1, gpus="0")
        assert not refused.ok
        assert "other-platform-job" in refused.error
        assert host.table.compute_mode(0) == COMPUTE_MODE_DEFAULT
        assert host.lock_is_free(0)


def test_kill_9_and_restart_keeps_the_lease_and_removes_orphans(
    host: Host, docker_client: object, busybox_image: str, lease_cleanup: list[str], tmp_path: Path
) -> None:
    lease, orphan_lease = str(uuid.uuid4()), str(uuid.uuid4())
    lease_cleanup.extend([lease, orphan_lease])
    with HubPeer(new_token()) as hub:
        with _agent(host, hub, "a", tmp_path / "a.log") as (process, conn):
            assert hub.command(conn, "reserve", lease, 1, gpus="0").ok
            started = hub.command(
                conn, "docker_run", lease, 1, image=busybox_image, ports=[8080], command=_httpd("x")
            )
            assert started.ok, started.error
            agent_id = (host.root / "a" / "agent_id").read_text().strip()
            # A container of ours that no claim owns (as if the agent died between creating it
            # and recording the claim).
            docker_client.containers.run(  # type: ignore[attr-defined]
                busybox_image,
                ["sleep", "600"],
                detach=True,
                labels={"cloudgpu.claim": agent_id, "cloudgpu.lease": orphan_lease},
            )
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
            assert host.lock_is_free(0)  # the kernel dropped the dead agent's flock

        with _agent(host, hub, "a", tmp_path / "a2.log") as (_, conn):
            register = hub.wait_for(conn, "register")
            assert [c.lease_id for c in register.claims] == [lease]
            assert register.claims[0].container_id == started.result["container_id"]
            wait_for(
                lambda: _containers(docker_client, orphan_lease) == [],
                timeout_s=60,
                what="orphan removal",
            )
            assert [c.status for c in _containers(docker_client, lease)] == ["running"]
            assert not host.lock_is_free(0)  # re-claimed by the new agent process
            assert hub.command(conn, "release", lease, 1).ok
            assert host.lock_is_free(0)


def test_the_same_docker_run_twice_across_a_restart_leaves_one_container(
    host: Host, docker_client: object, busybox_image: str, lease_cleanup: list[str], tmp_path: Path
) -> None:
    lease = str(uuid.uuid4())
    lease_cleanup.append(lease)
    run_id = str(uuid.uuid4())
    run = {"image": busybox_image, "ports": [8080], "command": _httpd("y"), "command_id": run_id}
    with HubPeer(new_token()) as hub:
        with _agent(host, hub, "a", tmp_path / "a.log") as (_, conn):
            assert hub.command(conn, "reserve", lease, 1, gpus="0").ok
            first = hub.command(conn, "docker_run", lease, 1, **dict(run))
            assert first.ok, first.error
            # A new command id for the same lease: the container is found, not made again.
            again = hub.command(
                conn, "docker_run", lease, 1, **{**run, "command_id": str(uuid.uuid4())}
            )
            assert again.ok, again.error
            assert again.result["container_id"] == first.result["container_id"]
        with _agent(host, hub, "a", tmp_path / "a2.log") as (_, conn):
            repeated = hub.command(conn, "docker_run", lease, 1, **dict(run))
            assert repeated == first
        assert len(_containers(docker_client, lease)) == 1


def test_a_kill_9_during_warm_up_never_reports_the_lease_running_unwarmed(
    host: Host, docker_client: object, busybox_image: str, lease_cleanup: list[str], tmp_path: Path
) -> None:
    lease = str(uuid.uuid4())
    lease_cleanup.append(lease)
    # Counts its runs; the first one hangs (the agent is killed during it), later ones finish.
    warmup = [
        "sh",
        "-c",
        "echo run >> /www/warmups; [ $(wc -l < /www/warmups) -gt 1 ] || sleep 600",
    ]
    run = {
        "type": "docker_run",
        "command_id": str(uuid.uuid4()),
        "lease_id": lease,
        "epoch": 1,
        "image": busybox_image,
        "ports": [8080],
        "command": _httpd("w"),
        "warmup": warmup,
    }

    def warm_ups() -> int:
        containers = _containers(docker_client, lease)
        if not containers:
            return 0
        try:
            out = containers[0].exec_run(["cat", "/www/warmups"]).output.decode()  # type: ignore[attr-defined]
        except docker.errors.APIError:
            return 0  # created but not started yet (exec answers 409): no warm-up has run
        return out.count("run")

    with HubPeer(new_token()) as hub:
        with _agent(host, hub, "a", tmp_path / "a.log") as (process, conn):
            assert hub.command(conn, "reserve", lease, 1, gpus="0").ok
            hub.send(conn, run)  # not awaited: it acks only after the warm-up
            wait_for(lambda: warm_ups() == 1, timeout_s=60, what="the warm-up to start")
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        with _agent(host, hub, "a", tmp_path / "a2.log") as (_, conn):
            # The hub sends the unacknowledged command again.
            hub.send(conn, run)
            ack = hub.wait_for(conn, "ack", lambda m: m.command_id == run["command_id"])
            assert ack.ok, ack.error
            assert warm_ups() == 2  # ran again to the end, not skipped


def test_the_warm_up_output_reaches_the_hub_as_log_chunks_before_the_ack(
    host: Host, docker_client: object, busybox_image: str, lease_cleanup: list[str], tmp_path: Path
) -> None:
    # Issue 21 item 2: the renter's page shows the warm-up's output while it runs. It waits
    # for a file the test makes only after the first line arrived as the lease's log_chunk.
    lease = str(uuid.uuid4())
    lease_cleanup.append(lease)
    run = {
        "type": "docker_run",
        "command_id": str(uuid.uuid4()),
        "lease_id": lease,
        "epoch": 1,
        "image": busybox_image,
        "ports": [8080],
        "command": _httpd("w"),
        "warmup": ["sh", "-c", "echo cold; until [ -e /go ]; do sleep 0.1; done; echo warm"],
    }

    def said(conn: Any, text: str) -> bool:
        chunks = [m for m in conn.received if getattr(m, "TYPE", None) == "log_chunk"]
        return text in "".join(m.data for m in chunks if m.lease_id == lease)

    with HubPeer(new_token()) as hub, _agent(host, hub, "a", tmp_path / "a.log") as (_, conn):
        assert hub.command(conn, "reserve", lease, 1, gpus="0").ok
        hub.send(conn, run)
        hub.wait(lambda: said(conn, "cold\n"), timeout_s=60, what="the warm-up's first line")
        assert not any(
            getattr(m, "TYPE", None) == "ack" and m.command_id == run["command_id"]
            for m in conn.received
        )
        _containers(docker_client, lease)[0].exec_run(["touch", "/go"])  # type: ignore[attr-defined]
        ack = hub.wait_for(conn, "ack", lambda m: m.command_id == run["command_id"])
        assert ack.ok, ack.error
        hub.wait(lambda: said(conn, "warm\n[warm-up] finished\n"), what="the warm-up's end")


def test_with_the_hub_away_only_leases_past_their_paid_time_are_released(
    host: Host, docker_client: object, busybox_image: str, lease_cleanup: list[str], tmp_path: Path
) -> None:
    expired, paid = str(uuid.uuid4()), str(uuid.uuid4())
    lease_cleanup.extend([expired, paid])
    hub = HubPeer(new_token()).__enter__()
    hub_up = True
    try:
        with _agent(host, hub, "a", tmp_path / "a.log") as (_, conn):
            for gpu, lease, until in (
                (0, expired, "2000-01-01T00:00:00Z"),
                (1, paid, "2999-01-01T00:00:00Z"),
            ):
                assert hub.command(conn, "reserve", lease, 1, gpus=str(gpu)).ok
                run = hub.command(
                    conn,
                    "docker_run",
                    lease,
                    1,
                    image=busybox_image,
                    command=["sleep", "600"],
                    paid_until=until,
                )
                assert run.ok, run.error
            hub.__exit__(None, None, None)  # the hub goes away; the agent stays
            hub_up = False
            wait_for(
                lambda: _containers(docker_client, expired) == [],
                timeout_s=60,
                what="the dead-man switch to release the expired lease",
            )
            # The same sweep looked at the paid lease and left it alone.
            assert [c.status for c in _containers(docker_client, paid)] == ["running"]
            assert host.lock_is_free(0)
            assert not host.lock_is_free(1)
    finally:
        if hub_up:
            hub.__exit__(None, None, None)


def test_a_container_that_exits_on_its_own_is_reported_with_its_code(
    host: Host, docker_client: object, busybox_image: str, lease_cleanup: list[str], tmp_path: Path
) -> None:
    lease = str(uuid.uuid4())
    lease_cleanup.append(lease)
    with HubPeer(new_token()) as hub, _agent(host, hub, "a", tmp_path / "a.log") as (_, conn):
        assert hub.command(conn, "reserve", lease, 1, gpus="0").ok
        script = "echo model loaded; trap 'echo out of memory; exit 3' TERM; sleep 600 & wait"
        run = hub.command(
            conn, "docker_run", lease, 1, image=busybox_image, command=["sh", "-c", script]
        )
        assert run.ok, run.error
        # Something other than the agent stops it (a crash, an OOM kill, the job finishing).
        docker_client.containers.get(run.result["container_id"]).kill(signal="SIGTERM")  # type: ignore[attr-defined]
        exited = hub.wait_for(conn, "container_exited", lambda m: m.lease_id == lease)
        assert exited.exit_code == 3
        assert "out of memory" in exited.log_tail
        assert exited.oom_killed is False  # it said so itself; the kernel did not kill it


def test_a_memory_bomb_is_killed_inside_its_limit_and_the_agent_reports_it(
    host: Host, docker_client: object, busybox_image: str, lease_cleanup: list[str], tmp_path: Path
) -> None:
    lease = str(uuid.uuid4())
    lease_cleanup.append(lease)
    total_mib = int(Path("/proc/meminfo").read_text().split()[1]) // 1024
    with HubPeer(new_token()) as hub:
        # Everything but 600 MiB reserved: a lease on one of the two GPUs gets the 512 MiB floor.
        host.configure_agent("small", hub, "--reserve-memory-mib", str(total_mib - 600))
        with _agent(host, hub, "small", tmp_path / "small.log") as (process, conn):
            assert hub.command(conn, "reserve", lease, 1, gpus="0").ok
            bomb = "sleep 1; exec dd if=/dev/zero of=/dev/null bs=800M count=1"
            run = hub.command(
                conn, "docker_run", lease, 1, image=busybox_image, command=["sh", "-c", bomb]
            )
            assert run.ok, run.error
            container = run.result["container_id"]
            limit = docker_client.api.inspect_container(container)["HostConfig"]["Memory"]  # type: ignore[attr-defined]
            assert limit == 512 * 1024 * 1024

            exited = hub.wait_for(conn, "container_exited", lambda m: m.lease_id == lease)
            assert (exited.exit_code, exited.oom_killed) == (137, True)
            assert process.poll() is None  # the agent lives on


def _chunks(conn: PeerConnection, lease: str) -> list[object]:
    return [
        m for m in conn.received if getattr(m, "TYPE", None) == "log_chunk" and m.lease_id == lease
    ]  # type: ignore[attr-defined]


def _text(conn: PeerConnection, lease: str) -> str:
    return "".join(chunk.data for chunk in _chunks(conn, lease))  # type: ignore[attr-defined]


def test_live_logs_arrive_in_order_and_stop_when_the_hub_says_so(
    host: Host, busybox_image: str, lease_cleanup: list[str], tmp_path: Path
) -> None:
    lease = str(uuid.uuid4())
    lease_cleanup.append(lease)
    script = "i=0; while true; do i=$((i+1)); echo line $i; echo err $i >&2; sleep 0.1; done"
    with HubPeer(new_token()) as hub, _agent(host, hub, "a", tmp_path / "a.log") as (_, conn):
        unknown = str(uuid.uuid4())
        hub.send(conn, {"type": "logs", "lease_id": unknown, "follow": True, "tail": 0})
        refused = hub.wait_for(conn, "error", lambda m: unknown in m.reason)
        assert refused.ref == "logs"

        assert hub.command(conn, "reserve", lease, 1, gpus="0").ok
        run = hub.command(
            conn, "docker_run", lease, 1, image=busybox_image, command=["sh", "-c", script]
        )
        assert run.ok, run.error
        hub.send(conn, {"type": "logs", "lease_id": lease, "follow": True, "tail": 5})
        hub.wait(lambda: "line 12\n" in _text(conn, lease), what="a dozen lines of output")
        with hub._cond:
            seqs = [chunk.seq for chunk in _chunks(conn, lease)]  # type: ignore[attr-defined]
            lines = _text(conn, lease).splitlines()
        assert seqs == sorted(set(seqs))
        numbers = [int(line.split()[1]) for line in lines if line.startswith("line ")]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
        assert any(line.startswith("err ") for line in lines)  # stderr too

        hub.send(conn, {"type": "logs", "lease_id": lease, "follow": False})
        hub.send(conn, {"type": "ping", "nonce": "after-stop"})
        hub.wait_for(conn, "pong", lambda m: m.nonce == "after-stop")
        stopped_at = len(_chunks(conn, lease))
        # What was read before the stop may still be flushed once; then nothing comes.
        with pytest.raises(AssertionError, match="timed out"):
            hub.wait(lambda: len(_chunks(conn, lease)) > stopped_at + 1, timeout_s=2)


def test_a_flood_of_output_is_capped_and_says_what_was_dropped(
    host: Host, busybox_image: str, lease_cleanup: list[str], tmp_path: Path
) -> None:
    from supplier_agent import logs

    lease = str(uuid.uuid4())
    lease_cleanup.append(lease)
    # About 640 KiB/s, ten times the cap (and little enough not to fill Docker's log files).
    script = "while true; do head -c 32768 /dev/zero | tr '\\0' x; echo; sleep 0.05; done"
    with HubPeer(new_token()) as hub, _agent(host, hub, "a", tmp_path / "a.log") as (_, conn):
        assert hub.command(conn, "reserve", lease, 1, gpus="0").ok
        run = hub.command(
            conn, "docker_run", lease, 1, image=busybox_image, command=["sh", "-c", script]
        )
        assert run.ok, run.error
        hub.send(conn, {"type": "logs", "lease_id": lease, "follow": True, "tail": 0})
        hub.wait(lambda: len(_chunks(conn, lease)) >= 25, what="25 chunks")
        hub.send(conn, {"type": "logs", "lease_id": lease, "follow": False})
        with hub._cond:
            chunks = _chunks(conn, lease)[:25]
        assert "bytes dropped ...]" in "".join(c.data for c in chunks)  # type: ignore[attr-defined]
        # seq is the emission time in milliseconds while chunks come at most 10 a second.
        elapsed_s = (chunks[-1].seq - chunks[0].seq) / 1000  # type: ignore[attr-defined]
        sent = sum(c.data.count("x") for c in chunks)  # type: ignore[attr-defined]
        assert sent <= logs.BYTES_PER_S * (1 + elapsed_s) + logs.CHUNK_BYTES
        assert len(chunks) <= logs.CHUNKS_PER_S * elapsed_s + 2
        assert all(len(c.data.encode()) <= 16 * 1024 for c in chunks)  # type: ignore[attr-defined]


def test_heartbeats_go_on_while_a_slow_stale_container_is_stopped(
    host: Host, docker_client: object, busybox_image: str, lease_cleanup: list[str], tmp_path: Path
) -> None:
    lease = str(uuid.uuid4())
    lease_cleanup.append(lease)
    with HubPeer(new_token()) as hub:
        with _agent(host, hub, "a", tmp_path / "a.log") as (process, conn):
            assert hub.command(conn, "reserve", lease, 1, gpus="0").ok
            # PID 1 `sleep` ignores SIGTERM: stopping it takes the whole 10 s grace.
            run = hub.command(
                conn, "docker_run", lease, 1, image=busybox_image, command=["sleep", "600"]
            )
            assert run.ok, run.error
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        hub.desired_claims = []  # the hub no longer knows the lease: the agent must drop it
        with _agent(host, hub, "a", tmp_path / "a2.log") as (_, conn):
            hub.wait_for(conn, "heartbeat", timeout_s=8)
            # The heartbeat came while the container was still being stopped (its grace is
            # 10 s): the stop no longer holds heartbeats back.
            assert _containers(docker_client, lease) != []
            wait_for(
                lambda: _containers(docker_client, lease) == [],
                timeout_s=60,
                what="the stale container removed",
            )


@pytest.fixture
def renter_volume(docker_client: object) -> Iterator[str]:
    """A fresh renter volume's wire name; its Docker volume goes after the test."""
    name = f"vol-{uuid.uuid4().hex}{uuid.uuid4().hex[:8]}"
    yield name
    remove_volume(docker_client, f"cloudgpu-{name}")


def _volume_exists(docker_client: Any, name: str) -> bool:
    try:
        docker_client.volumes.get(f"cloudgpu-{name}")
    except NotFound:
        return False
    return True


def test_a_volume_over_its_cap_is_reported_so_on_reconnect_and_refused_to_the_next_lease(
    host: Host,
    docker_client: object,
    busybox_image: str,
    lease_cleanup: list[str],
    renter_volume: str,
    tmp_path: Path,
) -> None:
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    lease_cleanup.extend([first, second])
    volumes = [{"name": renter_volume, "path": "/data", "size_bytes": 1024}]
    fill = f"head -c 65536 /dev/zero > /data/blob && {' '.join(_httpd('x')[2:])}"
    with HubPeer(new_token()) as hub, _agent(host, hub, "a", tmp_path / "a.log") as (_, conn):
        # Connecting reports the host's volumes: this one is not there yet.
        first_report = hub.wait_for(conn, "volume_report")
        assert renter_volume not in {v.name for v in first_report.volumes}
        assert hub.command(conn, "reserve", first, 1, gpus="0").ok
        started = hub.command(
            conn,
            "docker_run",
            first,
            1,
            image=busybox_image,
            ports=[8080],
            command=["sh", "-c", fill],
            volumes=volumes,
        )
        assert started.ok, started.error
        assert hub.command(conn, "release", first, 1).ok

        hub.drop(conn)
        again = hub.wait_for_connection(count=2, timeout_s=60)
        report = hub.wait_for(
            again, "volume_report", lambda m: renter_volume in {v.name for v in m.volumes}
        )
        usage = next(v for v in report.volumes if v.name == renter_volume)
        assert usage.bytes >= 65536
        assert usage.over_cap
        assert not usage.in_use
        assert hub.command(again, "reserve", second, 1, gpus="0").ok
        refused = hub.command(
            again,
            "docker_run",
            second,
            1,
            image=busybox_image,
            ports=[8080],
            command=_httpd("y"),
            volumes=volumes,
        )

    assert not refused.ok
    assert refused.error == (
        f"volume {renter_volume} holds more than its size cap of 1 KiB: delete files from it or "
        "create a larger volume"
    )
    assert _containers(docker_client, second) == []


def test_a_deleted_volume_goes_once_its_lease_is_released_and_the_hub_hears_of_it(
    host: Host,
    docker_client: object,
    busybox_image: str,
    lease_cleanup: list[str],
    renter_volume: str,
    tmp_path: Path,
) -> None:
    lease = str(uuid.uuid4())
    lease_cleanup.append(lease)
    unknown = "vol-" + uuid.uuid4().hex + "0" * 8

    def removed(name: str) -> Callable[[Any], bool]:
        return lambda m: name in {r.name for r in m.removed if r.reason == "deleted"}

    with HubPeer(new_token()) as hub, _agent(host, hub, "a", tmp_path / "a.log") as (_, conn):
        assert hub.command(conn, "reserve", lease, 1, gpus="0").ok
        started = hub.command(
            conn,
            "docker_run",
            lease,
            1,
            image=busybox_image,
            ports=[8080],
            command=_httpd("x"),
            volumes=[{"name": renter_volume, "path": "/data"}],
        )
        assert started.ok, started.error
        hub.send(conn, {"type": "volume_delete", "name": unknown})
        hub.send(conn, {"type": "volume_delete", "name": renter_volume})
        # The unknown one is answered at once; the mounted one stays while its lease runs.
        hub.wait_for(conn, "volume_report", removed(unknown))
        assert _volume_exists(docker_client, renter_volume)
        assert not any(removed(renter_volume)(m) for m in conn.received if hasattr(m, "removed"))

        assert hub.command(conn, "release", lease, 1).ok

        hub.wait_for(conn, "volume_report", removed(renter_volume))
        assert not _volume_exists(docker_client, renter_volume)
