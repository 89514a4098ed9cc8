"""What the disk guard counts (supplier_agent/disk_usage.py), on this machine's real files and
processes: blocks once per inode, a bounded walk that never follows a renter's symlink out of
its folder, files deleted but held open, and volumes that already hold more than a rental may."""

from __future__ import annotations

import os
from pathlib import Path

from supplier_agent.disk_guard import volumes_refusal
from supplier_agent.disk_usage import (
    Usage,
    add_deleted_open_files,
    measure_tree,
    pid_namespace,
    processes_by_pid_namespace,
)

MIB = 1024**2


def _fill(path: Path, mib: int) -> None:
    with open(path, "wb") as handle:
        handle.write(b"x" * (mib * MIB))
        handle.flush()
        os.fsync(handle.fileno())


def test_blocks_count_once_per_inode_and_the_walk_stops_at_its_limit(tmp_path: Path) -> None:
    _fill(tmp_path / "a", 1)
    os.link(tmp_path / "a", tmp_path / "hard")  # the same blocks
    (tmp_path / "sub").mkdir()
    for i in range(20):
        (tmp_path / "sub" / str(i)).write_bytes(b"y")
    usage = Usage()
    assert measure_tree(str(tmp_path), usage, limit=1000)
    assert usage.files == 23
    assert MIB <= usage.bytes < 2 * MIB

    bounded = Usage()
    measure_tree(str(tmp_path), bounded, limit=5)
    assert bounded.files == 6  # the first file past the limit ends the walk


def test_sparse_files_count_what_they_hold_not_their_length(tmp_path: Path) -> None:
    with open(tmp_path / "sparse", "wb") as handle:
        handle.truncate(10 * 1024 * MIB)  # 10 GiB long, nothing written
    usage = Usage()
    measure_tree(str(tmp_path), usage, limit=1000)
    assert usage.bytes < MIB


def test_a_symlink_in_a_rental_is_never_followed(tmp_path: Path) -> None:
    rental = tmp_path / "rental"
    rental.mkdir()
    _fill(tmp_path / "host-file", 2)
    (rental / "escape").symlink_to(tmp_path)  # a renter points at the host's folders
    usage = Usage()
    assert measure_tree(str(rental), usage, limit=1000)
    assert usage.files == 1
    assert usage.bytes < MIB


def test_a_folder_that_cannot_be_read_says_so(tmp_path: Path) -> None:
    assert measure_tree(str(tmp_path / "gone"), Usage(), limit=1000) is False
    (tmp_path / "link").symlink_to(tmp_path)
    assert measure_tree(str(tmp_path / "link"), Usage(), limit=1000) is False


def test_a_file_deleted_while_open_is_counted_through_its_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "hidden"
    handle = open(path, "wb")  # noqa: SIM115 - held open past its unlink on purpose
    try:
        handle.write(b"z" * (4 * MIB))
        handle.flush()
        os.fsync(handle.fileno())
        path.unlink()
        walked = Usage()
        measure_tree(str(tmp_path), walked, limit=1000)
        assert walked.bytes == 0  # no folder lists it

        device = os.stat(tmp_path).st_dev
        namespace = pid_namespace(os.getpid())
        assert namespace is not None
        ours = processes_by_pid_namespace()[namespace]
        assert os.getpid() in ours
        held = Usage()
        add_deleted_open_files(ours, {device}, held)
        assert held.bytes >= 4 * MIB
        # On another device (a container's tmpfs, say): memory, not the disk.
        elsewhere = Usage()
        add_deleted_open_files([os.getpid()], {device + 1}, elsewhere)
        assert elsewhere.bytes == 0
    finally:
        handle.close()


def test_volumes_holding_more_than_the_allowance_refuse_the_rental(tmp_path: Path) -> None:
    cache, data = tmp_path / "cache", tmp_path / "data"
    cache.mkdir()
    data.mkdir()
    _fill(cache / "model", 2)
    _fill(data / "set", 2)
    assert volumes_refusal([str(cache), str(data)], 8 * MIB) is None
    refusal = volumes_refusal([str(cache), str(data)], 3 * MIB)
    assert refusal is not None
    assert "already hold 4 MiB" in refusal
    assert "over its disk allowance of 3 MiB" in refusal
