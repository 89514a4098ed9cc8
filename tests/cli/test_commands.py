"""What each command sends the hub and makes of its answer, against a real HTTP server on
127.0.0.1 (tests/cli/canned_hub.py): rent's GPU selections and spec, exec, volumes, topup,
and `--help` and completion for every command."""

from __future__ import annotations

import contextlib
import os
import pty
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from cloudgpu_cli.main import cli, run

from tests.cli.canned_hub import (
    CLOUDGPU,
    CannedHub,
    canned_hub,
    cli_env,
    cloudgpu,
    lease,
    one_line,
)

LEASES = "/api/v1/leases/"
LEASE = lease()
EXEC = f"/api/v1/leases/{LEASE['id']}/exec/"
VOLUME_ID = "9f0e8d7c-0000-4000-8000-000000000002"
VOLUMES = [
    {
        "id": VOLUME_ID,
        "name": "models",
        "kind": "volume",
        "host_id": 7,
        "hostname": "vm",
        "state": "active",
        "removed_reason": "",
        "size_cap_bytes": 10 << 30,
        "used_bytes": 3 << 20,
        "over_cap": False,
    },
    {
        "id": "9f0e8d7c-0000-4000-8000-000000000003",
        "name": "models",
        "kind": "volume",
        "host_id": 8,
        "hostname": "other",
        "state": "removed",
        "removed_reason": "idle",
        "size_cap_bytes": 10 << 30,
        "used_bytes": None,
        "over_cap": False,
    },
]


@pytest.fixture
def hub() -> Iterator[CannedHub]:
    with canned_hub() as running:
        running.answer("POST", LEASES, 201, LEASE)
        running.answer("GET", "/api/v1/volumes/", 200, VOLUMES)
        yield running


@pytest.mark.parametrize(
    ("args", "sent"),
    [
        (["3", "4"], {"gpu_ids": [3, 4]}),
        (["--gpus", "count=2"], {"gpus": "count=2"}),
        (["--gpus", "count=2", "--model", "4090"], {"gpus": "count=2", "gpu_model": "4090"}),
        (["--host", "7", "--gpus", "0,1"], {"host_id": 7, "gpus": "0,1"}),
        (["--host", "7", "--gpus", "all"], {"host_id": 7, "gpus": "all"}),
        (["--host", "7", "--gpus", "GPU-abc"], {"host_id": 7, "gpus": "GPU-abc"}),
    ],
)
def test_rent_sends_each_gpu_selection(
    hub: CannedHub, tmp_path: Path, args: list[str], sent: dict[str, Any]
) -> None:
    result = cloudgpu(tmp_path, hub.url, "rent", *args, "--image", "busybox", "--no-wait")
    assert result.returncode == 0, result.stderr
    assert hub.bodies("POST", LEASES) == [{**sent, "image": "busybox"}]


def test_rent_sends_the_whole_spec(hub: CannedHub, tmp_path: Path) -> None:
    result = cloudgpu(
        tmp_path, hub.url, "rent", "--host", "7", "--gpus", "0",
        "--template", "pytorch", "--image", "mine:1", "--port", "8080", "--port", "22",
        "--env", "A=1", "--env", "B=x=y", "--command", "sh -c 'httpd -f -p 8080'",
        "--warmup", "python -c 'import torch'", "--volume", "models:/data",
        "--volume", f"{VOLUME_ID}:/more", "--protect", "--max-price", "$1.50", "--no-wait",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert hub.bodies("POST", LEASES) == [
        {
            "host_id": 7,
            "gpus": "0",
            "image": "mine:1",
            "template": "pytorch",
            "ports": [8080, 22],
            "env": {"A": "1", "B": "x=y"},
            "command": ["sh", "-c", "httpd -f -p 8080"],
            "warmup": ["python", "-c", "import torch"],
            "volumes": [
                # The name is looked up among the active volumes on --host.
                {"volume_id": VOLUME_ID, "path": "/data"},
                {"volume_id": VOLUME_ID, "path": "/more"},
            ],
            "access_protected": True,
            "max_price_per_hour": "1.50",
        }
    ]
    assert f"lease  {LEASE['id']}" in result.stdout


def test_no_warmup_clears_the_templates(hub: CannedHub, tmp_path: Path) -> None:
    result = cloudgpu(tmp_path, hub.url, "rent", "3", "--template", "t", "--no-warmup", "--json")
    assert result.returncode == 0, result.stderr
    assert hub.bodies("POST", LEASES) == [{"gpu_ids": [3], "template": "t", "warmup": []}]


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (["--image", "b"], "give GPU ids or --gpus"),
        (["3", "--gpus", "count=1", "--image", "b"], "give GPU ids or --gpus"),
        (["3", "--host", "7", "--image", "b"], "GPU ids name their host"),
        (["3"], "give --image or --template"),
        (["3", "--image", "b", "--env", "NOVALUE"], "--env takes K=V"),
        (["3", "--image", "b", "--command", "sh -c 'open"], "--command: No closing quotation"),
        (["3", "--image", "b", "--warmup", "x", "--no-warmup"], "--warmup or --no-warmup"),
        (["3", "--image", "b", "--volume", "models"], "--volume takes NAME:/path"),
        (["3", "--image", "b", "--volume", "nope:/data"], "no active volume called 'nope'"),
        (["3", "--image", "b", "--host", "9", "--gpus", "0"], "give GPU ids or --gpus"),
    ],
)
def test_rent_usage_errors_exit_2_before_renting(
    hub: CannedHub, tmp_path: Path, args: list[str], start: str
) -> None:
    one_line(cloudgpu(tmp_path, hub.url, "rent", *args), 2, start)
    assert hub.bodies("POST", LEASES) == []


def test_a_name_on_two_hosts_needs_the_host(hub: CannedHub, tmp_path: Path) -> None:
    hub.answer("GET", "/api/v1/volumes/", 200, [VOLUMES[0], {**VOLUMES[1], "state": "active"}])
    result = cloudgpu(tmp_path, hub.url, "rent", "3", "--image", "b", "--volume", "models:/d")
    one_line(result, 2, "volumes called 'models' on several hosts")


def test_rent_waits_until_running(hub: CannedHub, tmp_path: Path) -> None:
    hub.answer("POST", LEASES, 201, lease("starting"))
    answers = iter([lease("starting"), lease("running")])
    hub.routes[("GET", f"{LEASES}{LEASE['id']}/")] = lambda _: (200, next(answers))
    result = cloudgpu(tmp_path, hub.url, "rent", "3", "--image", "b")
    assert result.returncode == 0, result.stderr
    assert "state  running" in result.stdout
    assert result.stderr == ""  # no progress line when stderr is not a terminal


def test_exec_prints_the_output_and_exits_with_the_commands_code(
    hub: CannedHub, tmp_path: Path
) -> None:
    hub.answer("POST", EXEC, 200, {"exit_code": 3, "output": "out-42\n", "truncated": False})
    result = cloudgpu(tmp_path, hub.url, "exec", LEASE["id"], "--", "sh", "-c", "exit 3")
    assert (result.returncode, result.stdout, result.stderr) == (3, "out-42\n", "")
    assert hub.bodies("POST", EXEC) == [{"command": ["sh", "-c", "exit 3"], "timeout_s": 60}]


def test_exec_takes_options_before_the_lease_and_leaves_the_commands(
    hub: CannedHub, tmp_path: Path
) -> None:
    hub.answer("POST", EXEC, 200, {"exit_code": 0, "output": "", "truncated": True})
    result = cloudgpu(tmp_path, hub.url, "exec", "--timeout", "5", LEASE["id"], "ls", "--all")
    assert result.returncode == 0
    assert "cut to its last 1 MiB" in result.stderr
    assert hub.bodies("POST", EXEC) == [{"command": ["ls", "--all"], "timeout_s": 5}]


def test_exec_outliving_its_timeout_prints_what_it_said_and_exits_1(
    hub: CannedHub, tmp_path: Path
) -> None:
    hub.answer("POST", EXEC, 504, {"exit_code": None, "output": "so far\n", "truncated": False})
    result = cloudgpu(tmp_path, hub.url, "exec", "--timeout", "2", LEASE["id"], "sleep", "9")
    one_line(result, 1, "the command outlived --timeout 2 s")
    assert result.stdout == "so far\n"


def test_exec_the_host_could_not_run_exits_1(hub: CannedHub, tmp_path: Path) -> None:
    hub.answer("POST", EXEC, 502, {"exit_code": None, "output": "", "error": "no such file"})
    result = cloudgpu(tmp_path, hub.url, "exec", LEASE["id"], "nope")
    one_line(result, 1, "the host could not run it: no such file")


def test_exec_in_a_lease_not_running_exits_1(hub: CannedHub, tmp_path: Path) -> None:
    hub.answer("POST", EXEC, 409, {"detail": "the rental is not running"})
    one_line(cloudgpu(tmp_path, hub.url, "exec", LEASE["id"], "ls"), 1, "the rental is not")


def test_exec_without_a_command_is_a_usage_error(hub: CannedHub, tmp_path: Path) -> None:
    result = cloudgpu(tmp_path, hub.url, "exec", LEASE["id"])
    assert result.returncode == 2
    assert "Missing argument 'COMMAND...'" in result.stderr


def test_volumes_list_create_resize_delete(hub: CannedHub, tmp_path: Path) -> None:
    listed = cloudgpu(tmp_path, hub.url, "volumes")
    assert listed.returncode == 0, listed.stderr
    assert VOLUME_ID in listed.stdout
    assert "3.0 MiB" in listed.stdout
    assert "idle" not in listed.stdout  # removed ones only with --all
    assert "idle" in cloudgpu(tmp_path, hub.url, "volumes", "--all").stdout

    hub.answer("POST", "/api/v1/volumes/", 201, VOLUMES[0])
    made = cloudgpu(tmp_path, hub.url, "volumes", "create", "models", "--host", "7", "--size", "10")
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == VOLUME_ID
    assert hub.bodies("POST", "/api/v1/volumes/") == [
        {"host_id": 7, "name": "models", "size_gib": 10}
    ]

    detail = f"/api/v1/volumes/{VOLUME_ID}/"
    hub.answer("PATCH", detail, 200, VOLUMES[0])
    resized = cloudgpu(tmp_path, hub.url, "volumes", "resize", "models", "--size", "20")
    assert resized.returncode == 0, resized.stderr
    assert hub.bodies("PATCH", detail) == [{"size_gib": 20}]

    hub.answer("DELETE", detail, 200, {**VOLUMES[0], "state": "deleting"})
    deleted = cloudgpu(tmp_path, hub.url, "volumes", "delete", "models")
    assert deleted.returncode == 0, deleted.stderr
    assert "models: deleting" in deleted.stderr


def test_deleting_a_mounted_volume_is_refused_in_one_line(hub: CannedHub, tmp_path: Path) -> None:
    hub.answer("DELETE", f"/api/v1/volumes/{VOLUME_ID}/", 400, {"detail": "a rental mounts it"})
    one_line(cloudgpu(tmp_path, hub.url, "volumes", "delete", VOLUME_ID), 1, "a rental mounts")


def test_topup_asks_the_hub(hub: CannedHub, tmp_path: Path) -> None:
    hub.answer("POST", "/api/v1/top-ups/", 201, {"id": 4, "amount": "$25.00", "state": "waiting"})
    result = cloudgpu(tmp_path, hub.url, "topup", "$25", "--note", "by wire")
    assert result.returncode == 0, result.stderr
    assert "asked for $25.00 (request 4, waiting)" in result.stderr
    assert hub.bodies("POST", "/api/v1/top-ups/") == [{"amount": "25", "note": "by wire"}]


def test_topup_out_of_bounds_is_one_line(hub: CannedHub, tmp_path: Path) -> None:
    detail = "ask for between $1 and $100,000"
    hub.answer("POST", "/api/v1/top-ups/", 400, {"detail": detail})
    one_line(cloudgpu(tmp_path, hub.url, "topup", "0.5"), 1, detail)


def _every_command(group: click.Group, prefix: list[str]) -> Iterator[list[str]]:
    yield prefix
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _every_command(command, [*prefix, name])
        else:
            yield [*prefix, name]


def test_every_command_has_help_with_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    commands = list(_every_command(cli, []))
    assert len(commands) >= 20
    for path in commands:
        assert run(cli, [*path, "--help"]) == 0, path
        shown = capsys.readouterr().out
        assert f"Usage: cloudgpu {' '.join(path)}".rstrip() in shown, path
        assert "Exit codes: 0 ok" in shown, path


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_clicks_script(tmp_path: Path, shell: str) -> None:
    result = cloudgpu(tmp_path, "http://127.0.0.1:9", "completion", shell)
    assert result.returncode == 0, result.stderr
    assert "_CLOUDGPU_COMPLETE" in result.stdout
    assert f"{shell}_complete" in result.stdout


def test_the_completion_answers_with_commands(tmp_path: Path) -> None:
    result = cloudgpu(
        tmp_path, "http://127.0.0.1:9",
        COMP_WORDS="cloudgpu te", COMP_CWORD="1", _CLOUDGPU_COMPLETE="bash_complete",
    )  # fmt: skip
    assert result.stdout.split() == ["plain,templates", "plain,terminal"]


def test_exec_with_only_dashes_is_a_usage_error(hub: CannedHub, tmp_path: Path) -> None:
    one_line(cloudgpu(tmp_path, hub.url, "exec", LEASE["id"], "--"), 2, "give the command")


def test_on_a_terminal_rent_shows_its_progress(hub: CannedHub, tmp_path: Path) -> None:
    hub.answer("POST", LEASES, 201, lease("starting", warmup=["sh", "-c", "fetch weights"]))
    answers = iter([lease("starting", warmup=["sh"]), lease("running")])
    hub.routes[("GET", f"{LEASES}{LEASE['id']}/")] = lambda _: (200, next(answers))
    logs = {"log": "[warm-up] sh\n[weights] 40% [=====]\n", "log_tail": "", "state": "starting"}
    hub.answer("GET", f"{LEASES}{LEASE['id']}/logs/", 200, logs)
    controller, side = pty.openpty()
    shown = bytearray()

    def drain() -> None:
        # Read as it is written: a full pty buffer would block the CLI's status refreshes.
        with contextlib.suppress(OSError):
            while chunk := os.read(controller, 65536):
                shown.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        result = subprocess.run(
            [CLOUDGPU, "rent", "3", "--image", "b"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=side,
            env=cli_env(tmp_path, hub.url),
            timeout=60,
            check=False,
        )
    finally:
        os.close(side)  # the reader then gets EIO: the end of what was shown
        reader.join(timeout=10)
        os.close(controller)
    assert result.returncode == 0
    text = shown.decode(errors="replace")
    assert "lease 1a2b3c4d: starting" in text
    assert "[weights] 40% [=====]" in text  # the warm-up's line as it is, not read as markup
