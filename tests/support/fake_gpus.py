"""Simulated GPU hosts for tests: the device table read by the fake ``pynvml`` and the wiring
that makes ``import pynvml`` find the fake, in this process or in an agent subprocess.

Only ``pynvml`` is replaced; the agent's own modules run as they do on a real host.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.support.processes import REPO_ROOT

FAKE_NVML_DIR = REPO_ROOT / "tests" / "fakes" / "nvml"
TABLE_ENV = "CLOUDGPU_FAKE_NVML_TABLE"
H100 = "NVIDIA H100 80GB HBM3"
H100_MEMORY = 85_899_345_920

COMPUTE_MODE_DEFAULT = 0
COMPUTE_MODE_EXCLUSIVE_PROCESS = 3


def _load_fake() -> ModuleType:
    # Loaded under its own name so that table edits here share the fake's locking code without
    # putting a 'pynvml' into sys.modules as a side effect of importing this helper.
    spec = importlib.util.spec_from_file_location(
        "cloudgpu_fake_pynvml", FAKE_NVML_DIR / "pynvml.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_FAKE = _load_fake()


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08x}-0000-4000-8000-{index:012x}"


class FakeGpuTable:
    """The device table of one simulated host, shared by every process that points at it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(
        cls,
        path: Path,
        gpu_count: int = 1,
        *,
        name: str = H100,
        compute_mode_settable: bool = True,
        driver_version: str = "570.86.15",
    ) -> FakeGpuTable:
        table = {
            "driver_version": driver_version,
            "cuda_driver_version": 12080,
            "gpus": [
                {
                    "uuid": gpu_uuid(i),
                    "name": name,
                    "memory_total": H100_MEMORY,
                    "memory_used": 0,
                    "utilization": 0,
                    "compute_mode": COMPUTE_MODE_DEFAULT,
                    "compute_mode_settable": compute_mode_settable,
                    "processes": [],
                    "ecc": {"corrected": 0, "uncorrected": 0},
                }
                for i in range(gpu_count)
            ],
        }
        _FAKE.write_table(str(path), table)
        return cls(path)

    def read(self) -> dict[str, Any]:
        return json.loads(self.path.read_text(encoding="utf-8"))

    def update(self, change: Callable[[dict[str, Any]], None]) -> None:
        _FAKE.update_table(str(self.path), change)

    def update_gpu(self, index: int, **fields: Any) -> None:
        self.update(lambda table: table["gpus"][index].update(fields))

    def add_process(
        self, index: int, pid: int, name: str = "python3", used_memory: int = 1 << 30
    ) -> None:
        """A compute process on the GPU, as another platform's job would show up in NVML."""
        process = {"pid": pid, "name": name, "used_memory": used_memory}
        self.update(lambda table: table["gpus"][index]["processes"].append(process))

    def remove_process(self, index: int, pid: int) -> None:
        def change(table: dict[str, Any]) -> None:
            gpu = table["gpus"][index]
            gpu["processes"] = [p for p in gpu["processes"] if p["pid"] != pid]

        self.update(change)

    def fail(self, index: int, function: str, error_code: int) -> None:
        """Make one pynvml function fail on one GPU (e.g. 15, 'GPU is lost')."""
        self.update(
            lambda table: table["gpus"][index]
            .setdefault("errors", {})
            .update({function: error_code})
        )

    def raise_xid(self, index: int, xid: int) -> None:
        """The driver reports an XID on the GPU (e.g. 79, fallen off the bus; 48, a
        double-bit ECC error): delivered to NVML event sets registered before it."""
        self.update(lambda table: table["gpus"][index].setdefault("xid_events", []).append(xid))

    def add_ecc_errors(self, index: int, *, uncorrected: int = 0, corrected: int = 0) -> None:
        def change(table: dict[str, Any]) -> None:
            ecc = table["gpus"][index].setdefault("ecc", {"corrected": 0, "uncorrected": 0})
            ecc["uncorrected"] = ecc.get("uncorrected", 0) + uncorrected
            ecc["corrected"] = ecc.get("corrected", 0) + corrected

        self.update(change)

    def compute_mode(self, index: int) -> int:
        return int(self.read()["gpus"][index]["compute_mode"])


def fake_nvml_env(table_path: Path) -> dict[str, str]:
    """Environment additions that make an agent subprocess import the fake ``pynvml``."""
    parts = [str(FAKE_NVML_DIR), str(REPO_ROOT)]
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return {"PYTHONPATH": os.pathsep.join(parts), TABLE_ENV: str(table_path)}


@contextlib.contextmanager
def installed_fake_nvml(table_path: Path | None) -> Iterator[ModuleType]:
    """Make ``import pynvml`` in this process find the fake, reading ``table_path``.

    ``None`` simulates a host without the NVIDIA driver. Whatever ``pynvml`` was imported before
    comes back afterwards, so tests that use the fake cannot leak it into other tests.
    """
    saved_module = sys.modules.pop("pynvml", None)
    saved_table = os.environ.pop(TABLE_ENV, None)
    if table_path is not None:
        os.environ[TABLE_ENV] = str(table_path)
    sys.path.insert(0, str(FAKE_NVML_DIR))
    try:
        import pynvml  # the fake: its folder is first on sys.path and no copy is cached

        assert Path(pynvml.__file__).parent == FAKE_NVML_DIR
        yield pynvml
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(FAKE_NVML_DIR))
        sys.modules.pop("pynvml", None)
        if saved_module is not None:
            sys.modules["pynvml"] = saved_module
        os.environ.pop(TABLE_ENV, None)
        if saved_table is not None:
            os.environ[TABLE_ENV] = saved_table
