"""supplier_agent.gpu against the fake pynvml (the only fake): listing, processes, modes."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from supplier_agent.gpu import (
    COMPUTE_MODE_DEFAULT,
    COMPUTE_MODE_EXCLUSIVE_PROCESS,
    ComputeModeError,
    GpuQueryError,
    Nvml,
)
from supplier_agent.protocol import GpuProcess, GpuState
from tests.support.fake_gpus import H100, H100_MEMORY, FakeGpuTable, gpu_uuid, installed_fake_nvml

GPU_IS_LOST = 15
DRIVER_NOT_LOADED = 9
PID_NEVER_USED = 2**22 + 1  # above Linux's largest pid_max


@pytest.fixture
def table(tmp_path: Path) -> FakeGpuTable:
    return FakeGpuTable.create(tmp_path / "gpus.json", gpu_count=2)


@pytest.fixture
def nvml(table: FakeGpuTable) -> Iterator[Nvml]:
    with installed_fake_nvml(table.path):
        nvml = Nvml()
        yield nvml
        nvml.shutdown()


def test_lists_the_gpus_of_the_table(table: FakeGpuTable, nvml: Nvml) -> None:
    table.update_gpu(1, memory_used=2 << 30, utilization=87)
    table.add_process(1, pid=1234, name="python3", used_memory=2 << 30)

    assert nvml.available
    assert nvml.gpus() == [
        GpuState(0, gpu_uuid(0), H100, H100_MEMORY, 0, 0, ()),
        GpuState(
            1, gpu_uuid(1), H100, H100_MEMORY, 2 << 30, 87, (GpuProcess(1234, "python3", 2 << 30),)
        ),
    ]


def test_the_listing_follows_the_table_between_calls(table: FakeGpuTable, nvml: Nvml) -> None:
    assert nvml.gpus()[0].processes == ()
    table.add_process(0, pid=4321, name="train.py")

    assert [p.pid for p in nvml.gpus()[0].processes] == [4321]


def test_gpu_states_are_valid_protocol_messages(table: FakeGpuTable, nvml: Nvml) -> None:
    table.add_process(0, pid=1234)
    for state in nvml.gpus():
        as_json = {"processes": [vars(p) for p in state.processes]}
        as_json.update({k: v for k, v in vars(state).items() if k != "processes"})
        assert GpuState.parse(as_json, "gpu") == state


def test_a_host_without_the_driver_has_no_gpus() -> None:
    with installed_fake_nvml(None):
        nvml = Nvml()

        assert not nvml.available
        assert nvml.gpus() == []
        assert nvml.driver_version() is None
        assert nvml.unavailable_reason == "nvmlInit failed: NVML Shared Library Not Found"


def test_a_driver_that_fails_to_load_is_reported(table: FakeGpuTable) -> None:
    table.update(lambda data: data.update(init_error=DRIVER_NOT_LOADED))
    with installed_fake_nvml(table.path):
        nvml = Nvml()

        assert nvml.gpus() == []
        assert nvml.unavailable_reason == "nvmlInit failed: Driver Not Loaded"


def test_a_missing_pynvml_module_is_reported_not_raised() -> None:
    saved = sys.modules.get("pynvml")
    sys.modules["pynvml"] = None  # type: ignore[assignment]  # makes `import pynvml` fail
    try:
        nvml = Nvml()
        assert nvml.gpus() == []
        assert (nvml.unavailable_reason or "").startswith("pynvml is not importable")
    finally:
        del sys.modules["pynvml"]
        if saved is not None:
            sys.modules["pynvml"] = saved


def test_a_failing_field_gets_a_default_and_a_warning(
    table: FakeGpuTable, nvml: Nvml, caplog: pytest.LogCaptureFixture
) -> None:
    table.update_gpu(0, utilization=50)
    table.update_gpu(1, utilization=60)
    table.fail(0, "nvmlDeviceGetUtilizationRates", GPU_IS_LOST)
    table.fail(0, "nvmlDeviceGetMemoryInfo", GPU_IS_LOST)

    with caplog.at_level(logging.WARNING, logger="supplier_agent.gpu"):
        gpus = nvml.gpus()

    assert [(g.index, g.utilization_pct, g.memory_total_bytes) for g in gpus] == [
        (0, 0, 0),
        (1, 60, H100_MEMORY),
    ]
    assert "GPU 0: cannot read utilization: GPU is lost" in caplog.messages


def test_a_gpu_without_a_uuid_is_left_out(table: FakeGpuTable, nvml: Nvml) -> None:
    table.fail(0, "nvmlDeviceGetUUID", GPU_IS_LOST)

    assert [g.uuid for g in nvml.gpus()] == [gpu_uuid(1)]


def test_a_gpu_gone_from_the_bus_does_not_break_the_list(table: FakeGpuTable, nvml: Nvml) -> None:
    table.update(lambda data: data["gpus"].pop(0))

    assert [g.uuid for g in nvml.gpus()] == [gpu_uuid(1)]


def test_process_names_fall_back_to_proc(table: FakeGpuTable, nvml: Nvml) -> None:
    # name None: a process NVML cannot name, as happens across pid namespaces.
    table.add_process(0, pid=os.getpid(), name=None)  # type: ignore[arg-type]
    table.add_process(0, pid=PID_NEVER_USED, name=None)  # type: ignore[arg-type]
    own_comm = Path(f"/proc/{os.getpid()}/comm").read_text().strip()

    names = {p.pid: p.name for p in nvml.compute_processes(0)}

    assert names == {os.getpid(): own_comm, PID_NEVER_USED: ""}


def test_compute_processes_raise_when_nvml_cannot_say(table: FakeGpuTable, nvml: Nvml) -> None:
    table.fail(0, "nvmlDeviceGetComputeRunningProcesses", GPU_IS_LOST)

    with pytest.raises(GpuQueryError, match="GPU is lost"):
        nvml.compute_processes(0)


def test_compute_mode_is_set_and_restored(table: FakeGpuTable, nvml: Nvml) -> None:
    nvml.set_compute_mode(1, exclusive=True)
    assert table.compute_mode(1) == COMPUTE_MODE_EXCLUSIVE_PROCESS
    assert nvml.get_compute_mode(1) == COMPUTE_MODE_EXCLUSIVE_PROCESS
    assert table.compute_mode(0) == COMPUTE_MODE_DEFAULT

    nvml.set_compute_mode(1, exclusive=False)
    assert table.compute_mode(1) == COMPUTE_MODE_DEFAULT


def test_a_refused_compute_mode_raises_with_nvmls_reason(table: FakeGpuTable, nvml: Nvml) -> None:
    table.update_gpu(0, compute_mode_settable=False)

    with pytest.raises(ComputeModeError) as refused:
        nvml.set_compute_mode(0, exclusive=True)

    assert refused.value.reason == "Insufficient Permissions"
    assert table.compute_mode(0) == COMPUTE_MODE_DEFAULT


def test_index_for_uuid(nvml: Nvml) -> None:
    assert nvml.index_for_uuid(gpu_uuid(1)) == 1
    assert nvml.index_for_uuid(gpu_uuid(7)) is None


def test_driver_and_cuda_versions(nvml: Nvml) -> None:
    assert nvml.driver_version() == "570.86.15"
    assert nvml.cuda_version() == "12.8"


def test_shutdown_closes_the_nvml_session(nvml: Nvml) -> None:
    assert nvml.gpu_count() == 2
    import pynvml  # the fake, as installed by the fixture

    nvml.shutdown()

    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    # Used again, it opens a new session rather than failing.
    assert nvml.gpu_count() == 2
