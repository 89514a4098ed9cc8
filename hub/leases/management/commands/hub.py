"""`manage.py hub ...`: the control plane from the shell, before (and beside) the dashboard.

hub token create --owner USER [--name NAME] [--default-price DOLLARS]
                                                print a new agent token (shown once); its
                                                hosts' new GPUs are listed at the price
hub token revoke PREFIX_OR_ID
hub hosts                                       hosts, status and GPUs
hub lease start --renter USER [--host HOST] [--gpus SELECTION] [--model NAME] --image IMAGE
                [--port N ...] [--env K=V ...] [--warmup CMD] [--wait SECONDS] [--protect]
                [--command ARG ...]             --warmup runs in the container before the
                                                lease counts as running
                                                SELECTION: all, count=N, 0 or 0,1 (indices),
                                                GPU-<uuid>,...; without --host only count=N
hub lease release LEASE_ID [--reason REASON]
hub lease release-host HOST [--reason REASON] [--wait SECONDS]
                                                stop every active lease on a host and wait
                                                up to SECONDS for its agent to end them
hub lease show LEASE_ID                         state, ports and tunnel URLs
hub lease access-token LEASE_ID                 the token a --protect lease's URLs need
hub lease exec LEASE_ID --as ADMIN [--timeout S] -- COMMAND ...
                                                run a command in a running lease's container,
                                                recorded under the admin's name; prints its
                                                output, exits with its exit code
"""

from __future__ import annotations

import argparse
import shlex
import time
from typing import Any

from asgiref.sync import async_to_sync
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Q

from hub.accounts.models import User
from hub.billing.money import micros_from_units
from hub.leases import terminals
from hub.leases.gpu_choice import start_lease_on
from hub.leases.models import Lease
from hub.leases.services import LeaseError, LeaseSpec, release_lease
from hub.lib.gpu_select import InvalidGpuSelection, parse_gpu_selection
from hub.suppliers.models import AgentToken, Host
from hub.suppliers.services import SupplierError, create_agent_token, revoke_agent_token
from hub.tunnels import access as tunnel_access
from hub.tunnels import services as tunnel_services


def _user(username: str) -> User:
    try:
        return User.objects.get(username=username)
    except User.DoesNotExist:
        raise CommandError(f"no user {username!r}") from None


def _warmup(text: str | None) -> list[str] | None:
    try:
        return shlex.split(text) if text else None
    except ValueError as exc:
        raise CommandError(f"--warmup cannot be read: {exc}") from None


def _host(ref: str) -> Host:
    query = Q(hostname=ref)
    if ref.isdigit():
        query |= Q(pk=int(ref))
    if len(ref) == 36:
        query |= Q(agent_id=ref)
    hosts = list(Host.objects.filter(query)[:2])
    if len(hosts) != 1:
        raise CommandError(f"{ref!r} matches {len(hosts) or 'no'} host(s); use the host id")
    return hosts[0]


def _env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise CommandError(f"--env {pair!r} must look like NAME=value")
        env[name] = value
    return env


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        nouns = parser.add_subparsers(dest="noun", required=True)
        token = nouns.add_parser("token").add_subparsers(dest="verb", required=True)
        create = token.add_parser("create")
        create.add_argument("--owner", required=True)
        create.add_argument("--name", default="")
        create.add_argument(
            "--default-price",
            default=None,
            help="dollars per GPU-hour its hosts' new GPUs are listed at (default: unlisted)",
        )
        revoke = token.add_parser("revoke")
        revoke.add_argument("token")
        nouns.add_parser("hosts")
        lease = nouns.add_parser("lease").add_subparsers(dest="verb", required=True)
        start = lease.add_parser("start")
        start.add_argument("--renter", required=True)
        start.add_argument(
            "--host", help="hostname, id or uuid; omit it to take count=N GPUs on any host"
        )
        start.add_argument(
            "--gpus",
            default="0",
            help="all, count=N (any N free), 0 or 0,1 (indices: a bare number is an index), "
            "GPU-<uuid>,... (default 0)",
        )
        start.add_argument(
            "--model", help='with count=N: only GPUs whose name contains this, e.g. "RTX 4090"'
        )
        start.add_argument("--image", required=True)
        start.add_argument(
            "--warmup", help="a command run in the container before it counts as running"
        )
        start.add_argument("--port", type=int, action="append", default=[])
        start.add_argument("--env", action="append", default=[])
        start.add_argument("--command", nargs=argparse.REMAINDER)
        start.add_argument("--wait", type=float, default=0, help="wait up to N s for running")
        start.add_argument(
            "--protect", action="store_true", help="tunnel URLs need the lease's access token"
        )
        release = lease.add_parser("release")
        release.add_argument("lease")
        release.add_argument("--reason", default=Lease.EndReason.ADMIN)
        release_host = lease.add_parser("release-host")
        release_host.add_argument("host", help="hostname, id or uuid")
        release_host.add_argument("--reason", default=Lease.EndReason.ADMIN)
        release_host.add_argument(
            "--wait", type=float, default=0, help="wait up to N s for the leases to end"
        )
        show = lease.add_parser("show")
        show.add_argument("lease")
        access_token = lease.add_parser("access-token", help="print a protected lease's token")
        access_token.add_argument("lease")
        run = lease.add_parser(
            "exec", help="run a command in a running lease's container (recorded as yours)"
        )
        run.add_argument("lease")
        run.add_argument("--as", dest="admin", required=True, help="your staff username")
        run.add_argument("--timeout", type=int, default=60, help="seconds (default 60)")
        run.add_argument("command", nargs="+", help="the program and its arguments (after --)")

    def handle(self, *args: Any, **options: Any) -> None:
        noun, verb = options["noun"], options.get("verb")
        if noun == "token" and verb == "create":
            price = options["default_price"]
            try:
                token, plaintext = create_agent_token(
                    _user(options["owner"]),
                    options["name"],
                    default_price_per_hour_micros=None
                    if price is None
                    else micros_from_units(price),
                )
            except (ValueError, SupplierError) as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(plaintext)
            self.stderr.write(f"token {token.pk} ({token.prefix}…) created; it is shown only once")
        elif noun == "token":
            ref = options["token"]
            token = AgentToken.objects.filter(
                Q(prefix=ref) | Q(pk=int(ref) if ref.isdigit() else -1)
            ).first()
            if token is None:
                raise CommandError(f"no token {ref!r}")
            revoke_agent_token(token.pk)
            self.stdout.write(f"token {token.pk} revoked")
        elif noun == "hosts":
            for host in Host.objects.prefetch_related("gpus").order_by("pk"):
                gpus = ", ".join(f"{g.index}:{g.name}" for g in host.gpus.all() if g.present)
                self.stdout.write(f"{host.pk}\t{host.label}\t{host.status}\t{gpus}")
        elif verb == "start":
            self._start(options)
        elif verb == "access-token":
            lease = Lease.objects.get(pk=options["lease"])
            if not lease.access_protected:
                raise CommandError("this lease's URLs are not protected; it needs no token")
            self.stdout.write(tunnel_access.issue(lease.pk))
        elif verb == "exec":
            self._exec(options)
        elif verb == "release-host":
            self._release_host(options)
        elif verb == "release":
            lease = release_lease(options["lease"], options["reason"])
            self.stdout.write(f"lease {lease.pk}: {lease.state}")
        else:
            self._show(Lease.objects.get(pk=options["lease"]))

    def _release_host(self, options: dict[str, Any]) -> None:
        host = _host(options["host"])
        ids = list(
            Lease.objects.filter(host=host, state__in=Lease.ACTIVE_STATES).values_list(
                "pk", flat=True
            )
        )
        for lease_id in ids:
            release_lease(lease_id, options["reason"])
        deadline = time.monotonic() + options["wait"]
        active = Lease.objects.filter(pk__in=ids, state__in=Lease.ACTIVE_STATES)
        # The agent acks each release once its container is gone; polled, as `start --wait`.
        while active.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        left = active.count()
        self.stdout.write(f"{len(ids) - left} of {len(ids)} lease(s) on {host.label} ended")
        if left:
            raise CommandError(f"{left} lease(s) on {host.label} still stopping")

    def _exec(self, options: dict[str, Any]) -> None:
        admin = _user(options["admin"])
        if not admin.is_staff:
            raise CommandError(f"{admin.username} is not staff: only admins exec from the CLI")
        if not 1 <= options["timeout"] <= terminals.MAX_COMMAND_TIMEOUT_S:
            raise CommandError(f"--timeout: 1 to {terminals.MAX_COMMAND_TIMEOUT_S} seconds")
        command = tuple(options["command"])
        try:
            opened = terminals.open_as_admin(admin.pk, options["lease"], command)
        except terminals.TerminalRefused as exc:
            raise CommandError(str(exc)) from None
        result = async_to_sync(terminals.run_command)(opened, command, timeout_s=options["timeout"])
        self.stdout.write(result.output, ending="")
        if result.error:
            raise CommandError(result.error)
        if result.exit_code:
            raise CommandError(
                f"exit code {result.exit_code}", returncode=min(result.exit_code, 255)
            )

    def _start(self, options: dict[str, Any]) -> None:
        try:
            selection = parse_gpu_selection(options["gpus"])
        except InvalidGpuSelection as exc:
            raise CommandError(f"--gpus: {exc}") from None
        host = _host(options["host"]) if options["host"] else None
        spec = LeaseSpec(
            image=options["image"],
            ports=options["port"],
            env=_env(options["env"]),
            command=options["command"] or None,
            warmup=_warmup(options["warmup"]),
            access_protected=options["protect"],
        )
        try:
            lease = start_lease_on(
                _user(options["renter"]), selection, spec, host=host, model=options["model"]
            )
        except LeaseError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(str(lease.pk))
        deadline = time.monotonic() + options["wait"]
        while time.monotonic() < deadline:
            lease.refresh_from_db()
            if lease.state not in (Lease.State.RESERVING, Lease.State.STARTING):
                break
            time.sleep(0.5)
        if options["wait"]:
            self._show(lease)

    def _show(self, lease: Lease) -> None:
        self.stdout.write(
            f"lease {lease.pk}: {lease.state}"
            + (f" ({lease.end_reason})" if lease.end_reason else "")
            + (f" - {lease.failure_reason}" if lease.failure_reason else "")
            + (f" ports {lease.host_ports}" if lease.host_ports else "")
        )
        for tunnel in lease.tunnels.all():
            self.stdout.write(
                f"  port {tunnel.container_port}: {tunnel_services.public_url(tunnel)}"
                f" (tunnel {tunnel.state}{': ' + tunnel.detail if tunnel.detail else ''})"
            )
