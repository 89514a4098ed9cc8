"""A renter's GPU selection, as typed in the rent form, the API's ``gpus`` and
``manage.py hub lease start --gpus``: one grammar for all three (seed 000's ``-gpu`` forms).

A bare number is a GPU index everywhere (``1`` is GPU 1, as ``gpu_indices`` and the CLI always
meant), never a count: a count is written ``count=N``, so no text means two things.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

MAX_GPUS = 64  # per lease, as the API's gpu_indices
FORMS = (
    "all (every GPU of the host), count=N (any N free GPUs, 1-64), 0 or 0,1 (GPU indices; "
    "device=0,1 too), GPU-<uuid>[,GPU-<uuid>...] (NVML UUIDs)"
)
_UUID = re.compile(r"GPU-[0-9a-fA-F-]{8,90}")

Kind = Literal["all", "count", "indices", "uuids"]


class InvalidGpuSelection(ValueError):
    pass


@dataclass(frozen=True)
class GpuSelection:
    kind: Kind
    count: int = 0
    indices: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.kind == "all":
            return "all"
        if self.kind == "count":
            return f"count={self.count}"
        return ",".join(map(str, self.indices)) if self.kind == "indices" else ",".join(self.uuids)


def _refuse(text: str, why: str = "") -> InvalidGpuSelection:
    shown = text if len(text) <= 80 else text[:80] + "..."
    reason = f" ({why})" if why else ""
    return InvalidGpuSelection(f"GPUs {shown!r} is not a selection{reason}; use {FORMS}")


def parse_gpu_selection(text: str) -> GpuSelection:
    raw = text.strip()
    lowered = raw.lower()
    if lowered == "all":
        return GpuSelection("all")
    if lowered.startswith("count="):
        number = lowered.removeprefix("count=")
        if not number.isdigit() or not 1 <= int(number) <= MAX_GPUS:
            raise _refuse(text, f"a count is 1 to {MAX_GPUS}")
        return GpuSelection("count", count=int(number))
    if lowered.startswith("device="):
        raw = raw[len("device=") :]
    items = [item.strip() for item in raw.split(",")]
    if not raw or len(items) > MAX_GPUS:
        raise _refuse(text)
    if len(set(items)) != len(items):
        raise _refuse(text, "a GPU is named twice")
    if all(item.isascii() and item.isdigit() for item in items):
        indices = tuple(int(item) for item in items)
        if any(index >= MAX_GPUS for index in indices):
            raise _refuse(text, f"indices are 0 to {MAX_GPUS - 1}")
        return GpuSelection("indices", indices=indices)
    if all(_UUID.fullmatch(item) for item in items):
        return GpuSelection("uuids", uuids=tuple(items))
    raise _refuse(text)
