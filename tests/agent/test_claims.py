"""GPU claims with real files, real flock and real processes; only pynvml is faked."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from supplier_agent.claims import ClaimManager, ClaimRefused, lock_path
from supplier_agent.gpu import COMPUTE_MODE_DEFAULT, COMPUTE_MODE_EXCLUSIVE_PROCESS, Nvml
from tests.support.claim_race import ClaimProcess
from tests.support.fake_gpus import FakeGpuTable, installed_fake_nvml

AGENT_A = str(uuid.UUID(int=0xA))
AGENT_B = str(uuid.UUID(int=0xB))
LEASE_1 = str(uuid.UUID(int=1))
LEASE_2 = str(uuid.UUID(int=2))


@pytest.fixture
def table(tmp_path: Path) -> FakeGpuTable:
    return FakeGpuTable.create(tmp_path / "gpus.json", gpu_count=3)


@pytest.fixture
def lock_dir(tmp_path: Path) -> Path:
    return tmp_path / "locks"


@pytest.fixture
def nvml(table: FakeGpuTable) -> Iterator[Nvml]:
    with installed_fake_nvml(table.path):
        nvml = Nvml()
        yield nvml
        nvml.shutdown()


@pytest.fixture
def claims(lock_dir: Path, nvml: Nvml) -> ClaimManager:
    return ClaimManager(lock_dir, nvml, "best-effort", {"agent_id": AGENT_A, "pid": os.getpid()})


def lock_is_free(lock_dir: Path, index: int) -> bool:
    """Try the GPU's lock as another platform would, on a file description of our own."""
    path = lock_path(lock_dir, index)
    if not path.exists():
        return True
    with open(path) as other:
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(other, fcntl.LOCK_UN)
        return True


def test_reserve_locks_and_makes_the_gpu_exclusive(
    table: FakeGpuTable, lock_dir: Path, claims: ClaimManager
) -> None:
    result = claims.reserve(LEASE_1, [1])

    assert (result.indices, result.warnings, result.already_held) == ((1,), (), False)
    assert claims.held() == {LEASE_1: (1,)}
    assert table.compute_mode(1) == COMPUTE_MODE_EXCLUSIVE_PROCESS
    assert table.compute_mode(0) == COMPUTE_MODE_DEFAULT
    assert not lock_is_free(lock_dir, 1)
    info = json.loads(lock_path(lock_dir, 1).read_text())
    assert (info["agent_id"], info["pid"], info["lease_id"]) == (AGENT_A, os.getpid(), LEASE_1)
    assert claims.holder_of(1)["lease_id"] == LEASE_1  # type: ignore[index]


def test_release_restores_default_and_drops_the_lock(
    table: FakeGpuTable, lock_dir: Path, claims: ClaimManager
) -> None:
    claims.reserve(LEASE_1, [0, 2])

    assert claims.release(LEASE_1) == []

    assert [table.compute_mode(i) for i in (0, 2)] == [COMPUTE_MODE_DEFAULT] * 2
    assert lock_is_free(lock_dir, 0)
    assert lock_is_free(lock_dir, 2)
    assert claims.held() == {}
    assert claims.holder_of(0) is None


def test_lock_files_are_readable_by_other_users(lock_dir: Path, claims: ClaimManager) -> None:
    old_umask = os.umask(0o077)
    try:
        claims.reserve(LEASE_1, [0])
    finally:
        os.umask(old_umask)

    assert lock_path(lock_dir, 0).stat().st_mode & 0o777 == 0o644


def test_a_foreign_process_refuses_the_reserve(
    table: FakeGpuTable, lock_dir: Path, claims: ClaimManager
) -> None:
    table.add_process(0, pid=1234, name="python3")

    with pytest.raises(ClaimRefused) as refused:
        claims.reserve(LEASE_1, [0])

    assert refused.value.reason == (
        "GPU 0 is busy with foreign compute process(es): python3 (pid 1234)"
    )
    assert lock_is_free(lock_dir, 0)
    assert table.compute_mode(0) == COMPUTE_MODE_DEFAULT


def test_own_processes_are_not_foreign(table: FakeGpuTable, claims: ClaimManager) -> None:
    table.add_process(0, pid=1234, name="python3")

    assert claims.reserve(LEASE_1, [0], own_pids=frozenset({1234})).indices == (0,)


def test_second_gpu_busy_rolls_back_the_first(
    table: FakeGpuTable, lock_dir: Path, claims: ClaimManager
) -> None:
    table.add_process(2, pid=777, name="miner")

    with pytest.raises(ClaimRefused, match=r"GPU 2 is busy .*miner \(pid 777\)"):
        claims.reserve(LEASE_1, [2, 1])

    assert lock_is_free(lock_dir, 1)
    assert claims.held() == {}


def test_second_gpu_locked_elsewhere_rolls_back_the_first(
    lock_dir: Path, nvml: Nvml, claims: ClaimManager
) -> None:
    other = ClaimManager(lock_dir, nvml, "best-effort", {"agent_id": AGENT_B, "pid": os.getpid()})
    other.reserve(LEASE_2, [1])

    with pytest.raises(ClaimRefused) as refused:
        claims.reserve(LEASE_1, [0, 1])

    assert refused.value.reason == (
        f"GPU 1 is held by lease {LEASE_2} of agent {AGENT_B} (pid {os.getpid()})"
    )
    assert lock_is_free(lock_dir, 0)
    assert other.held() == {LEASE_2: (1,)}


def test_second_gpu_mode_refused_rolls_back_the_first_gpus_mode(
    table: FakeGpuTable, lock_dir: Path, nvml: Nvml
) -> None:
    table.update_gpu(1, compute_mode_settable=False)
    claims = ClaimManager(lock_dir, nvml, "require", {"agent_id": AGENT_A})

    with pytest.raises(ClaimRefused, match="could not set EXCLUSIVE_PROCESS on GPU 1"):
        claims.reserve(LEASE_1, [0, 1])

    # GPU 0 was switched to EXCLUSIVE_PROCESS before GPU 1 failed: it must be switched back.
    assert table.compute_mode(0) == COMPUTE_MODE_DEFAULT
    assert lock_is_free(lock_dir, 0)
    assert lock_is_free(lock_dir, 1)


@pytest.mark.parametrize(
    ("policy", "refused", "warnings"),
    [
        (
            "best-effort",
            None,
            ("could not set EXCLUSIVE_PROCESS on GPU 0: Insufficient Permissions",),
        ),
        ("require", "could not set EXCLUSIVE_PROCESS on GPU 0: Insufficient Permissions", None),
        ("skip", None, ()),
    ],
)
def test_compute_mode_policies_when_the_mode_cannot_be_set(
    table: FakeGpuTable,
    lock_dir: Path,
    nvml: Nvml,
    policy: str,
    refused: str | None,
    warnings: tuple[str, ...] | None,
) -> None:
    table.update_gpu(0, compute_mode_settable=False)
    claims = ClaimManager(lock_dir, nvml, policy, {"agent_id": AGENT_A})

    if refused is not None:
        with pytest.raises(ClaimRefused) as error:
            claims.reserve(LEASE_1, [0])
        assert error.value.reason == refused
        assert lock_is_free(lock_dir, 0)
    else:
        assert claims.reserve(LEASE_1, [0]).warnings == warnings
        assert not lock_is_free(lock_dir, 0)
    assert table.compute_mode(0) == COMPUTE_MODE_DEFAULT


def test_skip_never_touches_the_compute_mode(
    table: FakeGpuTable, lock_dir: Path, nvml: Nvml
) -> None:
    table.update_gpu(0, compute_mode=2)  # PROHIBITED, as some host owner set it
    claims = ClaimManager(lock_dir, nvml, "skip", {"agent_id": AGENT_A})

    claims.reserve(LEASE_1, [0])
    assert table.compute_mode(0) == 2
    claims.release(LEASE_1)
    assert table.compute_mode(0) == 2


def test_an_already_exclusive_gpu_is_left_as_it_was(
    table: FakeGpuTable, lock_dir: Path, nvml: Nvml
) -> None:
    # An admin set EXCLUSIVE_PROCESS and runs the agent without the right to change modes.
    table.update_gpu(0, compute_mode=COMPUTE_MODE_EXCLUSIVE_PROCESS, compute_mode_settable=False)
    claims = ClaimManager(lock_dir, nvml, "require", {"agent_id": AGENT_A})

    assert claims.reserve(LEASE_1, [0]).warnings == ()
    assert claims.release(LEASE_1) == []
    assert table.compute_mode(0) == COMPUTE_MODE_EXCLUSIVE_PROCESS


def test_an_unknown_gpu_is_refused(claims: ClaimManager) -> None:
    with pytest.raises(ClaimRefused) as refused:
        claims.reserve(LEASE_1, [0, 5])

    assert refused.value.reason == "GPU 5 does not exist on this host (it has 3)"
    assert claims.held() == {}


def test_reserve_and_release_are_idempotent(table: FakeGpuTable, claims: ClaimManager) -> None:
    claims.reserve(LEASE_1, [0, 1])

    again = claims.reserve(LEASE_1, [1, 0])
    assert (again.indices, again.already_held) == ((0, 1), True)
    with pytest.raises(ClaimRefused, match="already holds GPU"):
        claims.reserve(LEASE_1, [0])

    assert claims.release(LEASE_1) == []
    assert claims.release(LEASE_1) == []
    assert claims.release(LEASE_2) == []
    assert table.compute_mode(0) == COMPUTE_MODE_DEFAULT


def test_another_lease_of_the_same_agent_is_refused(claims: ClaimManager) -> None:
    claims.reserve(LEASE_1, [0])

    with pytest.raises(ClaimRefused) as refused:
        claims.reserve(LEASE_2, [0])

    assert refused.value.reason == (
        f"GPU 0 is held by lease {LEASE_1} of agent {AGENT_A} (pid {os.getpid()})"
    )


def test_a_lock_held_by_another_platform_names_its_pid(
    lock_dir: Path, claims: ClaimManager
) -> None:
    lock_dir.mkdir()
    with open(lock_path(lock_dir, 0), "w") as foreign:  # locks, writes nothing
        fcntl.flock(foreign, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ClaimRefused) as refused:
            claims.reserve(LEASE_1, [0])

    assert refused.value.reason == f"GPU 0 is locked by another process (pid {os.getpid()})"


def test_info_left_by_a_dead_holder_is_ignored(lock_dir: Path, claims: ClaimManager) -> None:
    lock_dir.mkdir()
    stale = {"agent_id": AGENT_B, "pid": 999999, "lease_id": LEASE_2, "since": "2025-01-01"}
    lock_path(lock_dir, 0).write_text(json.dumps(stale) + "\n")

    assert claims.holder_of(0) is None
    assert claims.reserve(LEASE_1, [0]).indices == (0,)
    assert claims.holder_of(0)["lease_id"] == LEASE_1  # type: ignore[index]


def test_a_failed_restore_is_a_warning_and_the_lock_still_goes(
    table: FakeGpuTable, lock_dir: Path, claims: ClaimManager
) -> None:
    claims.reserve(LEASE_1, [0])
    table.update_gpu(0, compute_mode_settable=False)

    assert claims.release(LEASE_1) == [
        "could not restore DEFAULT compute mode on GPU 0: Insufficient Permissions"
    ]
    assert lock_is_free(lock_dir, 0)

    # The lock file still says we set the mode, so the next start-up retries.
    table.update_gpu(0, compute_mode_settable=True)
    assert claims.restore_default_modes([0]) == []
    assert table.compute_mode(0) == COMPUTE_MODE_DEFAULT


def test_startup_restore_leaves_modes_set_after_a_clean_release(
    table: FakeGpuTable, claims: ClaimManager
) -> None:
    claims.reserve(LEASE_1, [0])
    claims.release(LEASE_1)
    table.update_gpu(0, compute_mode=COMPUTE_MODE_EXCLUSIVE_PROCESS)  # an admin's choice

    assert claims.restore_default_modes([0]) == []
    assert table.compute_mode(0) == COMPUTE_MODE_EXCLUSIVE_PROCESS


# --- real processes -----------------------------------------------------------------------


def test_two_processes_racing_for_gpu_0_one_wins(
    table: FakeGpuTable, lock_dir: Path, tmp_path: Path
) -> None:
    racers = [
        ClaimProcess(table.path, lock_dir, lease, agent, tmp_path / f"racer-{n}.log")
        for n, (lease, agent) in enumerate([(LEASE_1, AGENT_A), (LEASE_2, AGENT_B)])
    ]
    try:
        for racer in racers:
            ready = racer.read()
            assert ready["ready"] is True
            assert ready["pynvml"].endswith("tests/fakes/nvml/pynvml.py")
        for racer in racers:
            racer.send("go")
        outcomes = [racer.read() for racer in racers]
        mode_while_held = table.compute_mode(0)
    finally:
        codes = [racer.stop() for racer in racers]

    winners = [o for o in outcomes if o["ok"]]
    losers = [o for o in outcomes if not o["ok"]]
    assert len(winners) == 1, outcomes
    winner, loser = winners[0], losers[0]
    assert loser["reason"] == (
        f"GPU 0 is held by lease {winner['lease_id']} of agent {winner['agent_id']} "
        f"(pid {winner['pid']})"
    )
    assert mode_while_held == COMPUTE_MODE_EXCLUSIVE_PROCESS
    assert codes == [0, 0]
    assert table.compute_mode(0) == COMPUTE_MODE_DEFAULT  # the winner released on exit
    assert lock_is_free(lock_dir, 0)


def test_a_killed_holder_leaves_no_lock_and_startup_restores_the_mode(
    table: FakeGpuTable, lock_dir: Path, nvml: Nvml, tmp_path: Path
) -> None:
    holder = ClaimProcess(table.path, lock_dir, LEASE_1, AGENT_A, tmp_path / "holder.log")
    try:
        holder.read()
        holder.send("go")
        assert holder.read()["ok"] is True
        os.kill(holder.process.pid, signal.SIGKILL)
        holder.process.wait(timeout=30)
    finally:
        holder.stop()
    assert table.compute_mode(0) == COMPUTE_MODE_EXCLUSIVE_PROCESS  # no release ran

    # Another agent may take the GPU, but it must not undo a mode it did not set.
    stranger = ClaimManager(lock_dir, nvml, "best-effort", {"agent_id": AGENT_B})
    assert stranger.restore_default_modes([0]) == []
    assert table.compute_mode(0) == COMPUTE_MODE_EXCLUSIVE_PROCESS

    restarted = ClaimManager(lock_dir, nvml, "best-effort", {"agent_id": AGENT_A})
    assert restarted.restore_default_modes([0, 1]) == []
    assert table.compute_mode(0) == COMPUTE_MODE_DEFAULT
    assert restarted.reserve(LEASE_2, [0]).indices == (0,)


def test_startup_restore_leaves_a_gpu_someone_holds(
    table: FakeGpuTable, lock_dir: Path, nvml: Nvml, claims: ClaimManager
) -> None:
    other = ClaimManager(lock_dir, nvml, "best-effort", {"agent_id": AGENT_A})
    other.reserve(LEASE_1, [0])  # same agent id, but a live claim

    assert claims.restore_default_modes([0]) == []
    assert table.compute_mode(0) == COMPUTE_MODE_EXCLUSIVE_PROCESS
