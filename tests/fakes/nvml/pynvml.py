"""THE fake NVML: a stand-in for nvidia-ml-py's ``pynvml`` module, and the only fake in CloudGPU.

There is no GPU on a developer's or CI's machine, so the GPU hardware is simulated at the
``pynvml`` boundary. Put this folder first on ``sys.path`` / ``PYTHONPATH`` and ``import pynvml``
finds this module instead of the real one; production code runs unchanged against either
(``tests/support/fake_gpus.py`` does the wiring).

The simulated hardware is a JSON device table in the file named by ``CLOUDGPU_FAKE_NVML_TABLE``::

    {"driver_version": "570.86.15", "cuda_driver_version": 12080,
     "init_error": null,
     "gpus": [{"uuid": "GPU-...", "name": "NVIDIA H100 80GB HBM3",
               "memory_total": 85899345920, "memory_used": 0, "utilization": 0,
               "compute_mode": 0, "compute_mode_settable": true,
               "processes": [{"pid": 1234, "name": "python3", "used_memory": 1024}],
               "errors": {"nvmlDeviceGetUtilizationRates": 15},
               "temperature": 41, "power_usage": 72000, "clocks": {"sm": 1980, "mem": 2619},
               "ecc": {"corrected": 0, "uncorrected": 0}, "clocks_event_reasons": 0,
               "xid_events": [79], "lost": false}]}

Like real GPUs, the table is shared by every process on the "host": each call re-reads the
file, and writes happen under an ``fcntl`` lock with an atomic replace, so concurrent agents
(and the test driving them) see one consistent device state. ``errors`` makes the named
function fail on that GPU with the given NVML error code (e.g. 15, GPU is lost);
``init_error`` makes ``nvmlInit`` fail (e.g. 9, driver not loaded). The health fields are the
ones a failing board shows: ``ecc`` the volatile ECC error totals, ``clocks_event_reasons`` the
throttle bitmask (0x40 hardware thermal slowdown), ``xid_events`` every XID the "driver" raised
on it, in order (an event set delivers those appended after it registered, as NVML delivers
only new events), ``lost`` true for a board that fell off the bus (every call on it then fails
with GPU_IS_LOST, as with the real driver). Without the variable or
the file, ``nvmlInit`` fails the way it does on a host without the NVIDIA driver.

Names, signatures, return types and error strings follow nvidia-ml-py 12.x: strings come back
as ``str``, error classes are ``NVMLError`` subclasses such as ``NVMLError_NoPermission``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import string
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

TABLE_ENV = "CLOUDGPU_FAKE_NVML_TABLE"

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlClocksEventReasonSwThermalSlowdown = 0x0000000000000020
nvmlClocksEventReasonHwThermalSlowdown = 0x0000000000000040
nvmlClocksThrottleReasonSwThermalSlowdown = nvmlClocksEventReasonSwThermalSlowdown
nvmlClocksThrottleReasonHwThermalSlowdown = nvmlClocksEventReasonHwThermalSlowdown

NVML_COMPUTEMODE_DEFAULT = 0
NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1  # support removed from the driver, as in the real NVML
NVML_COMPUTEMODE_PROHIBITED = 2
NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3
NVML_COMPUTEMODE_COUNT = 4


class NVMLError(Exception):
    """Same shape as the real one: ``.value`` is the code, ``str()`` the driver's wording, and
    ``NVMLError(code)`` builds the matching subclass (``NVMLError_NoPermission`` ...)."""

    _valClassMapping: dict[int, type[NVMLError]] = {}  # mirrors the real module
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
        NVML_ERROR_INSUFFICIENT_POWER: "Insufficient External Power",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_IRQ_ISSUE: "Interrupt Request Issue",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
        NVML_ERROR_CORRUPTED_INFOROM: "Corrupted infoROM",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
        NVML_ERROR_OPERATING_SYSTEM: "The operating system has blocked the request.",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
        NVML_ERROR_MEMORY: "Insufficient Memory",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }

    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return self._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


def _extract_error_classes() -> None:
    # The real module generates one subclass per NVML_ERROR_* name; so do we, same names.
    # globals(), not sys.modules: tests/support/fake_gpus.py loads this file under another name.
    namespace = globals()
    for name in [n for n in namespace if n.startswith("NVML_ERROR_")]:
        value = namespace[name]
        suffix = string.capwords(name.replace("NVML_ERROR_", ""), "_").replace("_", "")

        def new(cls: type[NVMLError], value: int = value) -> NVMLError:
            return NVMLError.__new__(cls, value)

        error_class = type(f"NVMLError_{suffix}", (NVMLError,), {"__new__": new})
        error_class.__module__ = __name__
        namespace[error_class.__name__] = error_class
        NVMLError._valClassMapping[value] = error_class


_extract_error_classes()


class nvmlFriendlyObject:  # the real module's names, lower case and all
    def __init__(self, dictionary: dict[str, Any]) -> None:
        for key, value in dictionary.items():
            setattr(self, key, value)

    def __str__(self) -> str:
        return str(self.__dict__)


class c_nvmlDevice_t:
    """A device handle; like the real one it names a physical GPU, here by its UUID."""

    def __init__(self, uuid: str) -> None:
        self.uuid = uuid

    def __repr__(self) -> str:
        return f"<fake nvmlDevice {self.uuid}>"


# --- the shared table -----------------------------------------------------------------------

_init_count = 0
_init_lock = threading.Lock()


def _table_path() -> str | None:
    return os.environ.get(TABLE_ENV) or None


def _read_table() -> dict[str, Any]:
    path = _table_path()
    if path is None:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    try:
        with open(path, encoding="utf-8") as table:
            return json.load(table)
    except FileNotFoundError:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND) from None


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    # A sidecar lock file: the table itself is replaced on every write, so it cannot carry it.
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def update_table(path: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Apply ``change`` to the table at ``path`` atomically with respect to other processes.

    Not part of pynvml; ``tests/support/fake_gpus.py`` uses it so test-side edits and the
    fake's own writes follow one locking protocol.
    """
    with _locked(path):
        with open(path, encoding="utf-8") as table:
            data = json.load(table)
        change(data)
        write_table(path, data)
    return data


def write_table(path: str, data: dict[str, Any]) -> None:
    """Replace the table in one rename so that readers never see half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".fake-nvml-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=1)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _check_init() -> dict[str, Any]:
    if _init_count == 0:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _read_table()


def _gpu(handle: c_nvmlDevice_t, function: str) -> dict[str, Any]:
    table = _check_init()
    for gpu in table.get("gpus", []):
        if gpu["uuid"] == handle.uuid:
            error = gpu.get("errors", {}).get(function)
            if gpu.get("lost"):
                error = NVML_ERROR_GPU_IS_LOST
            if error:
                raise NVMLError(int(error))
            return gpu
    # The GPU left the table: what the driver says when a board falls off the bus.
    raise NVMLError(NVML_ERROR_GPU_IS_LOST)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


# --- the API ----------------------------------------------------------------------------------


def nvmlInit() -> None:
    global _init_count
    table = _read_table()
    if table.get("init_error"):
        raise NVMLError(int(table["init_error"]))
    with _init_lock:
        _init_count += 1


def nvmlInitWithFlags(flags: int) -> None:
    nvmlInit()


def nvmlShutdown() -> None:
    global _init_count
    with _init_lock:
        if _init_count == 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        _init_count -= 1


def nvmlErrorString(result: int) -> str:
    return str(NVMLError(result))


def nvmlSystemGetDriverVersion() -> str:
    return str(_check_init()["driver_version"])


def nvmlSystemGetCudaDriverVersion() -> int:
    return int(_check_init()["cuda_driver_version"])


def nvmlSystemGetProcessName(pid: int) -> str:
    for gpu in _check_init().get("gpus", []):
        for process in gpu.get("processes", []):
            # A process without a name is one NVML cannot name (another pid namespace).
            if process["pid"] == pid and process.get("name") is not None:
                return str(process["name"])
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetCount() -> int:
    return len(_check_init().get("gpus", []))


def nvmlDeviceGetHandleByIndex(index: int) -> c_nvmlDevice_t:
    gpus = _check_init().get("gpus", [])
    if not 0 <= index < len(gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return c_nvmlDevice_t(gpus[index]["uuid"])


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> c_nvmlDevice_t:
    wanted = _text(uuid)
    for gpu in _check_init().get("gpus", []):
        if gpu["uuid"] == wanted:
            return c_nvmlDevice_t(wanted)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetIndex(handle: c_nvmlDevice_t) -> int:
    _gpu(handle, "nvmlDeviceGetIndex")
    uuids = [gpu["uuid"] for gpu in _check_init().get("gpus", [])]
    return uuids.index(handle.uuid)


def nvmlDeviceGetUUID(handle: c_nvmlDevice_t) -> str:
    return str(_gpu(handle, "nvmlDeviceGetUUID")["uuid"])


def nvmlDeviceGetName(handle: c_nvmlDevice_t) -> str:
    return str(_gpu(handle, "nvmlDeviceGetName")["name"])


def nvmlDeviceGetMemoryInfo(handle: c_nvmlDevice_t, version: int | None = None) -> Any:
    gpu = _gpu(handle, "nvmlDeviceGetMemoryInfo")
    total, used = int(gpu.get("memory_total", 0)), int(gpu.get("memory_used", 0))
    return nvmlFriendlyObject({"total": total, "used": used, "free": max(total - used, 0)})


def nvmlDeviceGetUtilizationRates(handle: c_nvmlDevice_t) -> Any:
    gpu = _gpu(handle, "nvmlDeviceGetUtilizationRates")
    return nvmlFriendlyObject(
        {"gpu": int(gpu.get("utilization", 0)), "memory": int(gpu.get("memory_utilization", 0))}
    )


def nvmlDeviceGetComputeRunningProcesses(handle: c_nvmlDevice_t) -> list[Any]:
    gpu = _gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
    return [
        nvmlFriendlyObject(
            {
                "pid": int(process["pid"]),
                # None is what the real module reports when the driver cannot say (WDDM).
                "usedGpuMemory": process.get("used_memory"),
                "gpuInstanceId": 0xFFFFFFFF,
                "computeInstanceId": 0xFFFFFFFF,
            }
        )
        for process in gpu.get("processes", [])
    ]


nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses


def nvmlDeviceGetComputeMode(handle: c_nvmlDevice_t) -> int:
    return int(_gpu(handle, "nvmlDeviceGetComputeMode").get("compute_mode", 0))


def nvmlDeviceSetComputeMode(handle: c_nvmlDevice_t, mode: int) -> None:
    gpu = _gpu(handle, "nvmlDeviceSetComputeMode")
    if mode == NVML_COMPUTEMODE_EXCLUSIVE_THREAD:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if mode not in (
        NVML_COMPUTEMODE_DEFAULT,
        NVML_COMPUTEMODE_PROHIBITED,
        NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
    ):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    # Real NVML needs root; the table says whether this "host" lets us.
    if not gpu.get("compute_mode_settable", True):
        raise NVMLError(NVML_ERROR_NO_PERMISSION)

    def change(table: dict[str, Any]) -> None:
        for entry in table.get("gpus", []):
            if entry["uuid"] == handle.uuid:
                entry["compute_mode"] = mode
                return
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)

    path = _table_path()
    assert path is not None  # _gpu() already read the table from it
    update_table(path, change)


# --- health: temperatures, power, clocks, ECC, throttling, XID events -----------------------


def nvmlDeviceGetTemperature(handle: c_nvmlDevice_t, sensor: int) -> int:
    return int(_gpu(handle, "nvmlDeviceGetTemperature").get("temperature", 40))


def nvmlDeviceGetPowerUsage(handle: c_nvmlDevice_t) -> int:
    """Milliwatts, like the real call."""
    return int(_gpu(handle, "nvmlDeviceGetPowerUsage").get("power_usage", 60000))


def nvmlDeviceGetClockInfo(handle: c_nvmlDevice_t, clock_type: int) -> int:
    clocks = _gpu(handle, "nvmlDeviceGetClockInfo").get("clocks", {})
    if clock_type == NVML_CLOCK_SM:
        return int(clocks.get("sm", 1410))
    if clock_type == NVML_CLOCK_MEM:
        return int(clocks.get("mem", 1593))
    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)


def nvmlDeviceGetTotalEccErrors(handle: c_nvmlDevice_t, error_type: int, counter_type: int) -> int:
    ecc = _gpu(handle, "nvmlDeviceGetTotalEccErrors").get("ecc")
    if ecc is None:  # a board without ECC (most consumer GPUs)
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    key = "uncorrected" if error_type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "corrected"
    return int(ecc.get(key, 0))


def nvmlDeviceGetCurrentClocksEventReasons(handle: c_nvmlDevice_t) -> int:
    return int(
        _gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").get("clocks_event_reasons", 0)
    )


nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons


class _EventSet:
    """What nvmlEventSetCreate returns: per registered GPU, how many of its XIDs it delivered."""

    def __init__(self) -> None:
        self.delivered: dict[str, int] = {}


def nvmlEventSetCreate() -> _EventSet:
    _check_init()
    return _EventSet()


def nvmlDeviceRegisterEvents(
    handle: c_nvmlDevice_t, event_types: int, event_set: _EventSet
) -> None:
    gpu = _gpu(handle, "nvmlDeviceRegisterEvents")
    if event_types & ~nvmlEventTypeXidCriticalError:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # only XIDs are simulated
    # Only what happens from now on, like the driver.
    event_set.delivered[handle.uuid] = len(gpu.get("xid_events", []))


def nvmlEventSetWait_v2(event_set: _EventSet, timeoutms: int) -> Any:
    """The next undelivered XID of the set's GPUs; NVML_ERROR_TIMEOUT when none came within
    ``timeoutms`` (the table is re-read every 10 ms meanwhile: simulated hardware time)."""
    deadline = time.monotonic() + timeoutms / 1000
    while True:
        for gpu in _check_init().get("gpus", []):
            uuid = gpu["uuid"]
            if uuid not in event_set.delivered:
                continue
            events = gpu.get("xid_events", [])
            seen = event_set.delivered[uuid]
            if len(events) > seen:
                event_set.delivered[uuid] = seen + 1
                return nvmlFriendlyObject(
                    {
                        "device": c_nvmlDevice_t(uuid),
                        "eventType": nvmlEventTypeXidCriticalError,
                        "eventData": int(events[seen]),
                        "gpuInstanceId": 0xFFFFFFFF,
                        "computeInstanceId": 0xFFFFFFFF,
                    }
                )
        if time.monotonic() >= deadline:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        time.sleep(0.01)


nvmlEventSetWait = nvmlEventSetWait_v2


def nvmlEventSetFree(event_set: _EventSet) -> None:
    event_set.delivered.clear()
