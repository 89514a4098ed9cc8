"""Human tables (rich) and --json output; tables go to stdout, messages to stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

# Piped output (scripts, `| grep`) would otherwise be cut to 80 columns and ids folded; a
# terminal keeps its own width.
out = Console(width=None if sys.stdout.isatty() else 250)
# Messages are lines to read or grep, never wrapped mid-path.
err = Console(stderr=True, highlight=False, soft_wrap=True)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.0f} GiB"


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _when(stamp: str | None) -> str:
    """`2026-12-04T15:55:35.42Z` as `2026-12-04 15:55:35` (UTC): the table is for reading."""
    return "-" if not stamp else stamp.replace("T", " ")[:19]


def offers_table(offers: list[dict[str, Any]]) -> Table:
    multi = any(o.get("num_gpus", 1) and o.get("num_gpus", 1) > 1 for o in offers)
    table = Table(box=None, header_style="bold")
    for col in ("gpu id", "model", "VRAM", "price/h"):
        table.add_column(col, justify="right" if col in ("gpu id", "VRAM", "price/h") else "left")
    if multi:
        table.add_column("GPUs", justify="right")
        table.add_column("total/h", justify="right")
    for col in ("host", "location", "uptime", "rtt"):
        table.add_column(col, justify="right" if col in ("uptime", "rtt") else "left")
    for o in offers:
        row = [str(o["gpu_id"]), o["model"], gib(o.get("vram_bytes")), o["price_per_hour"]]
        if multi:
            row += [str(o.get("num_gpus", 1)), str(o.get("total_price_per_hour", "-"))]
        uptime = o.get("uptime_7d")
        rtt = o.get("rtt_ms")
        row += [
            f"{o.get('host_name', '')} · {o.get('host_short_id', '')}",
            o.get("location") or "-",
            "-" if uptime is None else f"{uptime * 100:.1f}%" if uptime <= 1 else f"{uptime}%",
            "-" if rtt is None else f"{rtt:.0f} ms",
        ]
        table.add_row(*row)
    return table


def leases_table(leases: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    table.add_column("id", no_wrap=True, min_width=36)  # pasted into show/logs/stop: whole
    for col in ("state", "image", "GPUs", "host", "price/h", "started"):
        table.add_column(col)
    for lease in leases:
        gpus = ", ".join(g["model"] for g in lease.get("gpus", []))
        table.add_row(
            lease["id"],
            lease["state"],
            lease.get("image", ""),
            gpus,
            lease.get("host_label") or lease.get("hostname", ""),
            lease.get("price_per_hour", ""),
            _when(lease.get("running_since") or lease.get("created_at")),
        )
    return table


def lease_details(lease: dict[str, Any]) -> list[str]:
    lines = [
        f"lease  {lease['id']}",
        f"state  {lease['state']}",
        f"image  {lease.get('image', '')}",
        f"host   {lease.get('host_label') or lease.get('hostname', '')}",
        f"price  {lease.get('price_per_hour', '')}/h",
    ]
    if lease.get("cost"):
        lines.append(f"cost   {lease['cost']}")
    if lease.get("warmup"):
        lines.append(f"warmup {' '.join(lease['warmup'])}")
    for mount in lease.get("volumes") or []:
        lines.append(f"volume {mount['volume_id']} at {mount['path']}")
    if lease.get("failure_reason"):
        lines.append(f"failed {lease['failure_reason']}")
    if lease.get("end_reason"):
        lines.append(f"ended  {lease['end_reason']}")
    for url in lease.get("urls") or []:
        lines.append(f"port {url['port']}  {url.get('url') or url.get('state', '')}")
    ssh = lease.get("ssh")
    if isinstance(ssh, dict):
        lines.append(f"ssh    ssh -p {ssh['gateway_port']} {ssh['user']}@{ssh['gateway_host']}")
        for forward in ssh.get("forwards") or []:
            lines.append(f"ssh -L {forward['command']}")
    for warning in lease.get("warnings") or []:
        lines.append(f"warning {warning}")
    return lines


def templates_table(templates: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    for col in ("slug", "name", "image", "ports", "warm-up"):
        table.add_column(col)
    for t in templates:
        table.add_row(
            t["slug"],
            t.get("name", ""),
            t.get("image", ""),
            ",".join(map(str, t.get("ports") or [])) or "-",
            " ".join(t.get("warmup") or []) or "-",
        )
    return table


def volumes_table(volumes: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    table.add_column("id", no_wrap=True, min_width=36)  # pasted into rent --volume: whole
    for col in ("name", "kind", "host", "size", "used", "state"):
        table.add_column(col, justify="right" if col in ("size", "used") else "left")
    for v in volumes:
        state = v.get("state", "")
        if v.get("removed_reason"):
            state = f"{state} ({v['removed_reason']})"
        elif v.get("over_cap"):
            state = f"{state} (over its size)"
        table.add_row(
            str(v["id"]),
            v.get("name", ""),
            v.get("kind", ""),
            f"{v.get('hostname', '')} ({v.get('host_id', '')})",
            gib(v.get("size_cap_bytes")),
            human_bytes(v.get("used_bytes")),
            state,
        )
    return table


def keys_table(keys: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold")
    for col in ("id", "type", "fingerprint", "comment", "last used"):
        table.add_column(col)
    for k in keys:
        table.add_row(
            str(k["id"]),
            k["key_type"],
            k["fingerprint"],
            k.get("comment", ""),
            _when(k.get("last_used_at")),
        )
    return table


def ledger_lines(rows: list[dict[str, Any]]) -> list[str]:
    return [
        f"  {_when(r.get('created_at'))}  {r.get('amount', ''):>14}  {r.get('kind', '')}"
        + (f"  {r['reason']}" if r.get("reason") else "")
        for r in rows
    ]
