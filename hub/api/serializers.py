"""What the API reads and writes. Every response is one of these, so the OpenAPI schema at
/api/schema/ describes exactly what is sent. Money is integer micros next to a formatted string."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from hub.accounts.models import ApiScope, default_api_scopes
from hub.billing.models import LedgerEntry
from hub.billing.money import format_micros
from hub.catalog.offers import SORTS
from hub.leases.models import Lease
from hub.lib import disk_allowance
from hub.lib.gpu_select import InvalidGpuSelection, parse_gpu_selection
from hub.tunnels import renter_ssh
from hub.tunnels import services as tunnels
from hub.tunnels.models import Tunnel
from hub.volumes.models import Volume
from supplier_agent.protocol import MAX_ENV_VARS, MAX_GPUS_PER_LEASE, MAX_PORTS


class FormattedMoneyField(serializers.Field):
    """The formatted form of an integer micros attribute, read-only."""

    def __init__(self, *, cents: bool = False, **kwargs: Any) -> None:
        self.cents = cents
        kwargs["read_only"] = True
        super().__init__(**kwargs)

    def to_representation(self, value: int) -> str:
        return format_micros(value, cents=self.cents)


extend_schema_field({"type": "string", "example": "$1.500000"})(FormattedMoneyField)


class DiskWordsField(serializers.Field):
    """A size in bytes in words (``50 GiB``), read-only; empty for null."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs["read_only"] = True
        super().__init__(**kwargs)

    def get_attribute(self, instance: Any) -> Any:
        # Null bytes are words too (empty): DRF would skip to_representation for None.
        return super().get_attribute(instance) or 0

    def to_representation(self, value: int) -> str:
        return disk_allowance.words(value) if value else ""


extend_schema_field({"type": "string", "example": "50 GiB"})(DiskWordsField)


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="What went wrong, fit to show a person.")
    errors = serializers.DictField(
        required=False,
        child=serializers.JSONField(),
        help_text="Bad input only: DRF's messages per field.",
    )


class PriceChangedSerializer(serializers.Serializer):
    detail = serializers.CharField()
    price_per_hour = serializers.CharField(help_text="The price now, e.g. `$300.00`.")
    price_per_hour_micros = serializers.IntegerField()


# --- API tokens ---------------------------------------------------------------------------------


class ApiTokenSerializer(serializers.Serializer):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(read_only=True)
    prefix = serializers.CharField(read_only=True, help_text="The token's visible start.")
    created_at = serializers.DateTimeField(read_only=True)
    last_used_at = serializers.DateTimeField(read_only=True, allow_null=True)
    revoked_at = serializers.DateTimeField(read_only=True, allow_null=True)
    active = serializers.BooleanField(read_only=True)
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=ApiScope.choices),
        read_only=True,
        help_text="What the token may do: `read`, `leases`, `tokens`, `payouts`.",
    )


class ApiTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=ApiScope.choices),
        required=False,
        allow_empty=False,
        max_length=len(ApiScope.values),
        default=default_api_scopes,
        help_text=(
            "`read`, `leases`, `tokens` and/or `payouts`; `read` and `leases` when left out. A"
            " token can grant only scopes it has itself."
        ),
    )

    def validate_scopes(self, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise serializers.ValidationError("a scope is listed twice")
        return value


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(
        read_only=True, help_text="The token itself, shown this once: it is not stored."
    )


# --- catalogue ----------------------------------------------------------------------------------


OFFERS_PAGE_DEFAULT = 100
OFFERS_PAGE_MAX = 1000


class OfferQuerySerializer(serializers.Serializer):
    model = serializers.CharField(
        required=False, allow_blank=True, max_length=255, help_text="Part of the GPU's name."
    )
    min_vram_gib = serializers.IntegerField(required=False, min_value=0, max_value=1 << 20)
    max_price = serializers.DecimalField(
        required=False,
        max_digits=12,
        decimal_places=6,
        min_value=0,
        help_text="Highest price per hour, in units (e.g. 1.50).",
    )
    sort = serializers.ChoiceField(choices=list(SORTS), required=False, default="price")
    location = serializers.CharField(
        required=False, allow_blank=True, max_length=64, help_text="Part of the host's location."
    )
    min_cpus = serializers.IntegerField(required=False, min_value=0, max_value=65536)
    min_ram_gib = serializers.IntegerField(required=False, min_value=0, max_value=1 << 20)
    min_disk_gib = serializers.IntegerField(
        required=False, min_value=0, max_value=1 << 30, help_text="Free disk the agent reported."
    )
    min_cuda = serializers.RegexField(
        r"^\d{1,3}(\.\d{1,3})?$",
        required=False,
        max_length=7,
        help_text="Newest CUDA the host's driver supports, at least this (e.g. 12.4).",
    )
    max_rtt_ms = serializers.IntegerField(
        required=False, min_value=0, max_value=600_000, help_text="The hub-measured round trip."
    )
    min_uptime_pct = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=100,
        help_text="The host online at least this share of the last 7 days, in percent"
        " (as of its last refresh, every few minutes).",
    )
    num_gpus = serializers.IntegerField(
        required=False,
        default=1,
        min_value=1,
        max_value=MAX_GPUS_PER_LEASE,
        help_text="Only hosts with at least this many of their GPUs free and passing every"
        " filter, to rent together; `total_price_per_hour` is then this many at the GPU's price.",
    )
    limit = serializers.IntegerField(
        required=False,
        default=OFFERS_PAGE_DEFAULT,
        min_value=1,
        max_value=OFFERS_PAGE_MAX,
        help_text='Offers per page. A `Link: <...>; rel="next"` header names the next page.',
    )
    offset = serializers.IntegerField(required=False, default=0, min_value=0, max_value=1_000_000)
    after = serializers.CharField(
        required=False,
        default="",
        allow_blank=True,
        max_length=400,
        help_text="The page after the row this cursor names: the `Link` header's next page"
        " carries it for the `price`, `-price` and `model` sorts (deep pages cost no more than"
        " the first); other sorts page by `offset`.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("after") and attrs.get("offset"):
            raise serializers.ValidationError({"after": "give after or offset, not both"})
        return attrs


class OfferSerializer(serializers.Serializer):
    gpu_id = serializers.IntegerField(help_text="Pass it in `gpu_ids` to rent this GPU.")
    host_id = serializers.IntegerField()
    hostname = serializers.CharField()
    gpu_index = serializers.IntegerField()
    model = serializers.CharField()
    vram_bytes = serializers.IntegerField()
    price_per_hour_micros = serializers.IntegerField()
    price_per_hour = FormattedMoneyField(source="price_per_hour_micros", cents=True)
    utilization_pct = serializers.IntegerField()
    uptime_7d = serializers.FloatField(help_text="The host's share of the last 7 days online.")
    host_name = serializers.CharField(help_text="The supplier's name for the host.")
    host_short_id = serializers.CharField(help_text="Tells hosts with one name apart.")
    location = serializers.CharField(help_text="Where the host is, as its supplier says.")
    cpu_model = serializers.CharField()
    cpu_count = serializers.IntegerField()
    ram_bytes = serializers.IntegerField()
    disk_free_bytes = serializers.IntegerField(
        allow_null=True, help_text="Free disk the agent reported (null: not reported)."
    )
    driver_version = serializers.CharField(help_text="NVIDIA driver (empty: not reported).")
    cuda_version = serializers.CharField(
        help_text="Newest CUDA the driver supports (empty: not reported)."
    )
    rtt_ms = serializers.IntegerField(
        allow_null=True, help_text="Round trip between hub and agent, as the hub measured it."
    )
    disk_allowance_bytes = serializers.IntegerField(
        help_text="What a rental of this GPU may write on the host (container, cache and volumes"
        " together; a rental of several GPUs gets their sum): the host stops it past that."
        " `disk_free_bytes` is the host's free disk now, shared by all its rentals."
    )
    disk_allowance = DiskWordsField(
        source="disk_allowance_bytes", help_text="The same in words, e.g. `50 GiB`."
    )
    num_gpus = serializers.IntegerField(help_text="The `num_gpus` asked for (1 by default).")
    total_price_per_hour_micros = serializers.IntegerField(
        help_text="`num_gpus` GPUs at this price."
    )
    total_price_per_hour = FormattedMoneyField(source="total_price_per_hour_micros", cents=True)


class TemplateSerializer(serializers.Serializer):
    slug = serializers.SlugField()
    name = serializers.CharField()
    description = serializers.CharField()
    image = serializers.CharField()
    ports = serializers.ListField(child=serializers.IntegerField())
    env = serializers.DictField(child=serializers.CharField())
    command = serializers.ListField(child=serializers.CharField(), allow_null=True)
    warmup = serializers.ListField(
        child=serializers.CharField(),
        allow_null=True,
        help_text="Run in the container before the rental counts as running.",
    )
    min_vram_bytes = serializers.IntegerField()


# --- leases -------------------------------------------------------------------------------------


class VolumeMountSerializer(serializers.Serializer):
    volume_id = serializers.UUIDField(help_text="One of your volumes on the same host.")
    path = serializers.CharField(
        max_length=1024,
        help_text="An absolute folder in the container in normal form, outside the system"
        " folders (/proc, /sys, /dev, /etc, /usr, ...), e.g. `/data`.",
    )


class LeaseCreateSerializer(serializers.Serializer):
    gpu_ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1),
        required=False,
        min_length=1,
        max_length=MAX_GPUS_PER_LEASE,
        help_text="Offers' `gpu_id`s, all on one host. Or give `host_id` and `gpu_indices`.",
    )
    host_id = serializers.IntegerField(required=False, min_value=1)
    gpu_indices = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=MAX_GPUS_PER_LEASE - 1),
        required=False,
        min_length=1,
        max_length=MAX_GPUS_PER_LEASE,
    )
    gpus = serializers.CharField(
        required=False,
        max_length=4000,
        help_text=(
            "A GPU selection instead of `gpu_ids`/`gpu_indices`: `all` (every GPU of `host_id`),"
            " `count=N` (any N free GPUs: of `host_id`, or without it on the cheapest online"
            " host that has N, optionally of `gpu_model`), `0` or `0,1` (indices of `host_id`'s"
            " GPUs: a bare number is an index, never a count) or `GPU-<uuid>,...` (NVML UUIDs)."
        ),
    )
    gpu_model = serializers.CharField(
        required=False,
        max_length=255,
        help_text='With `gpus` `count=N`: only GPUs whose name contains this, e.g. "RTX 4090".',
    )
    template = serializers.SlugField(
        required=False, max_length=64, help_text="A listed template's slug."
    )
    image = serializers.CharField(
        required=False, max_length=512, help_text="A custom image, or overrides the template's."
    )
    ports = serializers.ListField(
        child=serializers.IntegerField(),
        required=False,
        max_length=MAX_PORTS,
        help_text="Container ports that get a URL each (1-65535); overrides the template's.",
    )
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False, max_length=4096),
        required=False,
        help_text=f"Added to the template's; at most {MAX_ENV_VARS} variables.",
    )
    command = serializers.ListField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False, max_length=4096),
        required=False,
        allow_null=True,
        max_length=256,
    )
    warmup = serializers.ListField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False, max_length=4096),
        required=False,
        allow_null=True,
        max_length=256,
        help_text=(
            "A warm-up command (argv) run in the container once its ports answer and before"
            " the lease counts as running (weights, compiles); overrides the template's, `[]`"
            " for none. A failed one fails the lease with its last lines."
        ),
    )
    access_protected = serializers.BooleanField(
        required=False,
        default=False,
        help_text="URLs need the lease's access token (POST /leases/{id}/access-token/).",
    )
    volumes = VolumeMountSerializer(
        many=True,
        required=False,
        max_length=4,
        help_text="Your volumes on the chosen host to mount, each at its own path.",
    )
    max_price_per_hour = serializers.DecimalField(
        required=False,
        max_digits=12,
        decimal_places=6,
        min_value=0,
        help_text=(
            "The most you agree to pay per hour for all the chosen GPUs together, in units"
            " (e.g. 1.50): send the total of the offers' `price_per_hour` you saw. If the"
            " supplier raised a price since, the rent is refused with 409 and the new"
            " `price_per_hour`, and nothing is rented. Without it the current price applies."
        ),
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        by_id, by_index, by_selection = (k in attrs for k in ("gpu_ids", "gpu_indices", "gpus"))
        if "host_id" in attrs and not (by_id or by_index or by_selection):
            raise serializers.ValidationError("`host_id` and `gpu_indices` go together")
        if by_id + by_index + by_selection != 1 or (by_id and "host_id" in attrs):
            raise serializers.ValidationError(
                "choose GPUs either by `gpu_ids` (from the offers), by `host_id` and"
                " `gpu_indices`, or by `gpus` (a selection, with `host_id` unless it is"
                " `count=N`)"
            )
        if by_index and "host_id" not in attrs:
            raise serializers.ValidationError("`host_id` and `gpu_indices` go together")
        if "gpu_model" in attrs and not by_selection:
            raise serializers.ValidationError({"gpu_model": ["goes with `gpus` `count=N`"]})
        if by_selection:
            try:
                attrs["gpus"] = parse_gpu_selection(attrs["gpus"])
            except InvalidGpuSelection as exc:
                raise serializers.ValidationError({"gpus": [str(exc)]}) from None
        if not attrs.get("template") and not attrs.get("image"):
            raise serializers.ValidationError("choose a `template` or give an `image`")
        return attrs


class VolumeSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    name = serializers.CharField(source="label")
    kind = serializers.ChoiceField(
        choices=Volume.Kind.choices, help_text="`volume`: yours; `cache`: a template's cache."
    )
    host_id = serializers.IntegerField()
    hostname = serializers.CharField(source="host.hostname")
    state = serializers.ChoiceField(choices=Volume.State.choices)
    removed_reason = serializers.ChoiceField(
        choices=[("", ""), *Volume.Reason.choices],
        help_text="Why it went: `deleted` (by you), `idle` (unused for the host's idle limit),"
        " `disk_low` (the host ran short of disk; oldest volumes went first).",
    )
    removed_at = serializers.DateTimeField(allow_null=True)
    size_cap_bytes = serializers.IntegerField(allow_null=True)
    used_bytes = serializers.IntegerField(
        allow_null=True, help_text="The host's last measurement (hourly); null until measured."
    )
    over_cap = serializers.BooleanField(
        help_text="Holds more than its size: it mounts into no new rental until trimmed."
    )
    measured_at = serializers.DateTimeField(allow_null=True)
    last_used_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()


class VolumeResizeSerializer(serializers.Serializer):
    size_gib = serializers.IntegerField(min_value=1, max_value=1 << 20)


class VolumeCreateSerializer(serializers.Serializer):
    host_id = serializers.IntegerField(min_value=1, help_text="The host it lives on.")
    name = serializers.CharField(max_length=64)
    size_gib = serializers.IntegerField(min_value=1, max_value=1 << 20)


class LeaseGpuSerializer(serializers.Serializer):
    gpu_id = serializers.IntegerField(source="gpu.pk")
    index = serializers.IntegerField(source="gpu.index")
    model = serializers.CharField(source="gpu.name")


class LeaseUrlSerializer(serializers.Serializer):
    port = serializers.IntegerField(source="container_port")
    url = serializers.SerializerMethodField()
    state = serializers.ChoiceField(choices=Tunnel.State.choices)
    detail = serializers.CharField()

    @extend_schema_field(serializers.URLField(allow_null=True))
    def get_url(self, tunnel: Tunnel) -> str | None:
        return tunnels.public_url(tunnel) if settings.TUNNEL_DOMAIN else None


class SshForwardSerializer(serializers.Serializer):
    port = serializers.IntegerField(help_text="The container's declared port.")
    listen_port = serializers.IntegerField(help_text="The gateway loopback port it is at.")
    local_port = serializers.IntegerField(help_text="A suggested port on your machine.")
    command = serializers.CharField(help_text="`ssh -N -L` through the gateway.")


class SshAccessSerializer(serializers.Serializer):
    gateway_host = serializers.CharField()
    gateway_port = serializers.IntegerField()
    user = serializers.CharField(help_text="The gateway's login for renters' keys.")
    host_alias = serializers.CharField()
    known_hosts = serializers.ListField(
        child=serializers.CharField(), help_text="The gateway's host key(s) as known_hosts lines."
    )
    forwards = SshForwardSerializer(many=True, help_text="One per declared port.")
    config = serializers.CharField(
        help_text="A ~/.ssh/config Host block for port 22 (ProxyJump through the gateway);"
        " empty when port 22 is not declared."
    )


class LeaseSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    state = serializers.ChoiceField(choices=Lease.State.choices)
    end_reason = serializers.ChoiceField(
        choices=[("", ""), *Lease.EndReason.choices], help_text="Empty while it runs."
    )
    failure_reason = serializers.CharField(help_text="Why it never ran, in words; or empty.")
    host_id = serializers.IntegerField()
    hostname = serializers.CharField(source="host.hostname")
    host_label = serializers.CharField(
        source="host.label", help_text="The host as pages name it: its name and short id."
    )
    gpus = LeaseGpuSerializer(source="lease_gpus.all", many=True)
    image = serializers.CharField()
    image_digest = serializers.CharField(
        help_text="What the container runs, pinned: 'repository@sha256:…' as pulled from its"
        " registry for this lease, or 'sha256:…' of an image the supplier rents out from their"
        " own host; empty until it runs."
    )
    ports = serializers.ListField(child=serializers.IntegerField())
    command = serializers.ListField(child=serializers.CharField(), allow_null=True)
    warmup = serializers.ListField(child=serializers.CharField(), allow_null=True)
    access_protected = serializers.BooleanField()
    volumes = serializers.SerializerMethodField()
    urls = LeaseUrlSerializer(source="tunnels.all", many=True, help_text="One per declared port.")
    ssh = serializers.SerializerMethodField(
        help_text="SSH through the tunnel gateway with your account's keys: null unless the"
        " lease runs, has ports and the hub has a gateway."
    )
    warnings = serializers.ListField(child=serializers.CharField())
    gpu_fault_at = serializers.DateTimeField(
        allow_null=True, help_text="When one of its GPUs failed under it (null: none did)."
    )
    gpu_fault_reason = serializers.CharField(help_text="Which GPU failed and how; or empty.")
    price_per_hour_micros = serializers.IntegerField()
    price_per_hour = FormattedMoneyField(source="price_per_hour_micros", cents=True)
    disk_allowance_bytes = serializers.IntegerField(
        allow_null=True,
        help_text="What it may write on the host (container, cache and volumes together), its"
        " GPUs' allowances when it started: the host stops it past that, with `end_reason`"
        " `disk`. Null for leases from before allowances (the host's own default applies).",
    )
    disk_allowance = DiskWordsField(source="disk_allowance_bytes")
    cost_micros = serializers.IntegerField(help_text="Charged so far (the ledger's rows).")
    cost = FormattedMoneyField(source="cost_micros")
    created_at = serializers.DateTimeField()
    running_since = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)

    @extend_schema_field(SshAccessSerializer(allow_null=True))
    def get_ssh(self, lease: Lease) -> dict[str, Any] | None:
        access = renter_ssh.lease_access(lease)
        return None if access is None else SshAccessSerializer(access).data

    @extend_schema_field(
        serializers.ListField(child=serializers.DictField(child=serializers.CharField()))
    )
    def get_volumes(self, lease: Lease) -> list[dict[str, str]]:
        """Mounted volumes as ``{"volume_id", "path"}``: wire names stay between hub and agent."""
        mounts = {m["name"]: m["path"] for m in lease.volumes or []}
        ids = dict(Volume.objects.filter(wire_name__in=list(mounts)).values_list("wire_name", "pk"))
        return [{"volume_id": str(ids[n]), "path": p} for n, p in mounts.items() if n in ids]


class LeaseLogsSerializer(serializers.Serializer):
    lease_id = serializers.UUIDField(source="id")
    state = serializers.ChoiceField(choices=Lease.State.choices)
    log = serializers.CharField(
        help_text="Recent live output (stdout and stderr as they came) that the hub kept while"
        " someone followed the lease's logs: at most the last 200 chunks, kept a day. Empty"
        " if nobody followed them."
    )
    log_tail = serializers.CharField(
        help_text="The last lines the agent reported when the container exited or failed;"
        " empty while it runs."
    )
    streamed = serializers.BooleanField(
        help_text="True when `log` holds streamed live output, false when it is empty."
    )


class AccessTokenSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="Send it to the lease's URLs.")
    header = serializers.CharField(help_text="Header that may carry the token.")
    cookie = serializers.CharField(help_text="Cookie that may carry the token.")
    expires_in_s = serializers.IntegerField(help_text="Or when the lease ends, if earlier.")
    urls = LeaseUrlSerializer(many=True)


# --- account ------------------------------------------------------------------------------------


class LedgerRowSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=LedgerEntry.Kind.choices)
    amount_micros = serializers.IntegerField(help_text="Negative for charges.")
    amount = FormattedMoneyField(source="amount_micros")
    lease_id = serializers.UUIDField(allow_null=True)
    reason = serializers.CharField()
    created_at = serializers.DateTimeField()


class AccountSerializer(serializers.Serializer):
    username = serializers.CharField()
    balance_micros = serializers.IntegerField()
    balance = FormattedMoneyField(source="balance_micros")
    ledger = LedgerRowSerializer(many=True, help_text="The most recent rows, newest first.")


# --- a supplier's GPUs ---------------------------------------------------------------------------


class GpuTermsSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    host_id = serializers.IntegerField()
    host_label = serializers.CharField(
        source="host.label", help_text="The host as pages name it: its name and short id."
    )
    index = serializers.IntegerField()
    model = serializers.CharField(source="name")
    priced = serializers.BooleanField(help_text="False until you set a price.")
    price_per_hour_micros = serializers.IntegerField()
    price_per_hour = FormattedMoneyField(source="price_per_hour_micros", cents=True)
    listed = serializers.BooleanField(help_text="For rent (once priced).")
    disk_allowance_bytes = serializers.IntegerField(
        help_text="What a rental of this GPU may write on the host (container, cache and volumes"
        " together); the host stops a rental past it."
    )
    disk_allowance = DiskWordsField(source="disk_allowance_bytes")


class GpuTermsUpdateSerializer(serializers.Serializer):
    price_per_hour = serializers.DecimalField(
        required=False,
        max_digits=12,
        decimal_places=6,
        min_value=0,
        help_text="In units per hour, e.g. 1.50 (at most 1000).",
    )
    listed = serializers.BooleanField(required=False, help_text="For rent; needs a price.")
    disk_allowance_gib = serializers.IntegerField(
        required=False,
        min_value=disk_allowance.MIN_BYTES // disk_allowance.GIB,
        max_value=disk_allowance.MAX_GIB,
        # The service's own words, whichever side of the bounds.
        error_messages=dict.fromkeys(("min_value", "max_value"), disk_allowance.BOUNDS),
        help_text=f"In GiB, from 1 to {disk_allowance.MAX_GIB} (100 TiB). Rentals running now"
        " keep the allowance they started with.",
    )


# --- payouts ------------------------------------------------------------------------------------


class PayoutSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    amount_micros = serializers.IntegerField()
    amount = FormattedMoneyField(source="amount_micros", cents=True)
    state = serializers.CharField(help_text="`requested`, `paid` or `cancelled`.")
    requested_at = serializers.DateTimeField()
    paid_at = serializers.DateTimeField(allow_null=True)
    reference = serializers.CharField(help_text="The transfer's reference, once paid.")


class PayoutsSerializer(serializers.Serializer):
    payable_micros = serializers.IntegerField(
        help_text="Your balance less payouts requested and not paid yet: what you can ask for."
    )
    payable = FormattedMoneyField(source="payable_micros", cents=True)
    minimum_micros = serializers.IntegerField(help_text="The smallest payout you may request.")
    payouts = PayoutSerializer(many=True, help_text="Your payouts, newest first.")


class PayoutRequestSerializer(serializers.Serializer):
    amount = serializers.DecimalField(
        max_digits=12,
        decimal_places=2,
        min_value=Decimal("0.01"),
        help_text="In units, e.g. 25.00; at most what is payable.",
    )


# --- top-ups ------------------------------------------------------------------------------------


class TopUpRequestSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    amount_micros = serializers.IntegerField()
    amount = FormattedMoneyField(source="amount_micros", cents=True)
    note = serializers.CharField()
    state = serializers.CharField(help_text="`waiting`, `added` (by an admin) or `declined`.")
    created_at = serializers.DateTimeField()
    handled_at = serializers.DateTimeField(allow_null=True)


class TopUpAskSerializer(serializers.Serializer):
    amount = serializers.DecimalField(
        max_digits=12,
        decimal_places=2,
        min_value=Decimal("0.01"),
        help_text="In units, e.g. 25.00 (from 1 to 100,000).",
    )
    note = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=500,
        help_text="For the admins: how you will pay, or what it is for.",
    )


# --- SSH keys -----------------------------------------------------------------------------------


class SshKeySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    key_type = serializers.CharField()
    fingerprint = serializers.CharField(help_text="OpenSSH's SHA256 fingerprint.")
    comment = serializers.CharField()
    public_key = serializers.CharField(source="line", help_text="The whole public key line.")
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(
        allow_null=True, help_text="The last gateway login with it (to the minute)."
    )


class SshKeyCreateSerializer(serializers.Serializer):
    public_key = serializers.CharField(
        max_length=8192,
        trim_whitespace=True,
        help_text="One OpenSSH public key line: ssh-ed25519, ecdsa-sha2-nistp256/384/521, or"
        " ssh-rsa of 2048 bits or more; the comment is kept.",
    )


# --- benchmarks (issue 21 item 5) -----------------------------------------------------------


class BenchmarkCreateSerializer(serializers.Serializer):
    model = serializers.CharField(
        max_length=200, help_text="The model name the rental's server serves."
    )
    concurrency = serializers.IntegerField(
        default=1, min_value=1, help_text="Requests in flight at once (BENCH_MAX_CONCURRENCY)."
    )
    isl = serializers.IntegerField(
        default=128, min_value=1, help_text="Prompt length in words (BENCH_MAX_ISL)."
    )
    osl = serializers.IntegerField(
        default=32, min_value=1, help_text="Tokens to generate per request (BENCH_MAX_OSL)."
    )
    requests = serializers.IntegerField(
        default=32, min_value=1, help_text="Requests in all (BENCH_MAX_REQUESTS)."
    )
    port = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=65535,
        help_text="Which of the lease's ports with a URL; the first when left out.",
    )


class BenchmarkRunSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    lease_id = serializers.UUIDField()
    state = serializers.CharField()
    port = serializers.IntegerField()
    model = serializers.CharField()
    concurrency = serializers.IntegerField()
    isl = serializers.IntegerField()
    osl = serializers.IntegerField()
    requests = serializers.IntegerField()
    result = serializers.JSONField(
        allow_null=True,
        help_text="Once done: requests_per_s, output_tokens_per_s, ttft_ms and itl_ms (p50, "
        "p99), ok, errors and error_examples, as `cloudgpu-agent bench --json` prints them.",
    )
    error = serializers.CharField(help_text="Why the run failed, if it did.")
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
