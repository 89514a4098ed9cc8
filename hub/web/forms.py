"""Dashboard forms: sign-up and log-in, renting, and a supplier's GPU terms."""

from __future__ import annotations

import dataclasses
import shlex
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import AuthenticationForm, UserCreationForm
from django.core.validators import MaxValueValidator
from django.db.models import QuerySet

from hub.accounts.models import DEFAULT_API_SCOPES, ApiScope
from hub.benchmarks import services as benchmarks
from hub.billing.money import micros_from_units
from hub.catalog.models import Template
from hub.catalog.offers import HostFilters
from hub.catalog.services import lease_spec
from hub.leases.services import LeaseError, LeaseSpec
from hub.lib.gpu_select import GpuSelection, InvalidGpuSelection, parse_gpu_selection
from hub.suppliers.models import Host
from hub.volumes.models import Volume
from hub.web import ratelimit
from supplier_agent.protocol import MAX_GPUS_PER_LEASE

GIB = 1 << 30
MAX_KEEP_ALIVE_HOURS = 24 * 30


class SignUpForm(UserCreationForm):
    class Meta(UserCreationForm.Meta):
        model = get_user_model()
        fields = ("username", "email")

    def clean_username(self) -> str:
        # Django's UsernameField has NFKC-normalised it, as it does at login: a fullwidth "renter"
        # arrives as "renter". Case is not enough to tell two people apart either.
        username = self.cleaned_data["username"]
        if get_user_model().objects.filter(username__iexact=username).exists():
            raise forms.ValidationError("That username is taken.", code="taken")
        return username


class RateLimitMixin:
    """The login limiter for any AuthenticationForm (the dashboard's and the admin's)."""

    error_messages = {
        "rate_limited": (
            "Too many failed log-in attempts for this username from your address. "
            "Wait 15 minutes and try again."
        ),
    }

    def clean(self) -> dict[str, Any]:
        username = self.data.get("username", "")  # type: ignore[attr-defined]
        request = self.request  # type: ignore[attr-defined]
        address = ratelimit.client_address(request) if request else "unknown"
        if ratelimit.blocked(username, address):
            raise forms.ValidationError(self.error_messages["rate_limited"], code="rate_limited")
        try:
            cleaned = super().clean()  # type: ignore[misc]
        except forms.ValidationError:
            ratelimit.record_failure(username, address)
            raise
        ratelimit.clear(username, address)
        return cleaned  # type: ignore[no-any-return]


class RateLimitedLoginForm(RateLimitMixin, AuthenticationForm):
    """Django's login form, refusing early once a username has failed too often from one
    address (the counter lives in the shared cache, see hub/web/ratelimit.py)."""

    error_messages = {**AuthenticationForm.error_messages, **RateLimitMixin.error_messages}


class RateLimitedAdminLoginForm(RateLimitMixin, AdminAuthenticationForm):
    """The admin's login form under the same limiter and counters."""

    error_messages = {**AdminAuthenticationForm.error_messages, **RateLimitMixin.error_messages}


def _parse_ports(text: str) -> list[Any]:
    ports: list[Any] = []
    for part in text.replace(",", " ").split():
        try:
            ports.append(int(part))
        except ValueError:
            raise forms.ValidationError(f"{part!r} is not a port number") from None
    return ports


def _parse_env(text: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep or not name.strip():
            raise forms.ValidationError(f"line {n} is not NAME=value")
        env[name.strip()] = value
    return env


class RentForm(forms.Form):
    gpus = forms.CharField(
        required=False,
        max_length=4000,
        label="GPUs on this host",
        help_text="Empty: this GPU. Or all (every GPU of the host), count=N (any N free GPUs), "
        "0 or 0,1 (GPU indices: a bare number is an index, never a count), or "
        "GPU-<uuid>,... (NVML UUIDs).",
    )
    template = forms.ModelChoiceField(
        queryset=Template.objects.filter(listed=True),
        required=False,
        empty_label="Custom image",
    )
    image = forms.CharField(
        required=False,
        max_length=512,
        help_text="For a custom image, e.g. pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime",
    )
    ports = forms.CharField(
        required=False,
        max_length=200,
        help_text="Container ports that get a URL each, e.g. 8888, 7860. Empty: the template's.",
    )
    env = forms.CharField(
        required=False,
        label="Environment",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "NAME=value, one a line"}),
    )
    command = forms.CharField(
        required=False,
        max_length=2000,
        help_text="As you would type it in a shell, e.g. python -m http.server 8888",
    )
    warmup = forms.CharField(
        required=False,
        max_length=2000,
        label="Warm-up command",
        help_text="Run in the container once its ports answer, before the rental counts as "
        "running (e.g. curl -sf localhost:8000/warmup). Empty: the template's, if any.",
    )
    keep_alive_hours = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_KEEP_ALIVE_HOURS,
        label="Stop automatically after (hours)",
        help_text="Empty: runs until you stop it or your balance runs out.",
    )
    access_protected = forms.BooleanField(
        required=False,
        label="Protect the URLs with an access token",
        help_text="The token is shown once, on the rental's page.",
    )
    volume = forms.ModelChoiceField(
        queryset=Volume.objects.none(),
        required=False,
        empty_label="None",
        label="Mount one of your volumes",
        help_text="Your volumes on this host (create them on the Volumes page).",
    )
    volume_path = forms.CharField(
        required=False,
        max_length=1024,
        initial="/data",
        label="At",
        help_text="A folder in the container, e.g. /data.",
    )
    # The price the renter saw (a hidden field of the rent page): the most they agreed to pay.
    seen_price_micros = forms.IntegerField(
        min_value=0, widget=forms.HiddenInput, error_messages={"required": "Reload the page."}
    )

    def __init__(self, *args: Any, volumes: QuerySet[Volume] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if volumes is not None:
            self.fields["volume"].queryset = volumes  # type: ignore[attr-defined]
            self.fields["volume"].label_from_instance = (  # type: ignore[attr-defined]
                lambda v: f"{v.label} ({v.size_cap_bytes // GIB} GiB)"
            )

    def clean_gpus(self) -> GpuSelection | None:
        text = self.cleaned_data["gpus"].strip()
        if not text:
            return None
        try:
            return parse_gpu_selection(text)
        except InvalidGpuSelection as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_ports(self) -> list[Any] | None:
        text = self.cleaned_data["ports"].strip()
        return _parse_ports(text) if text else None

    def clean_env(self) -> dict[str, str]:
        return _parse_env(self.cleaned_data["env"])

    def clean_command(self) -> list[str] | None:
        text = self.cleaned_data["command"].strip()
        if not text:
            return None
        try:
            return shlex.split(text)
        except ValueError as exc:
            raise forms.ValidationError(f"the command cannot be read: {exc}") from None

    def clean_warmup(self) -> list[str] | None:
        text = self.cleaned_data["warmup"].strip()
        if not text:
            return None
        try:
            return shlex.split(text)
        except ValueError as exc:
            raise forms.ValidationError(f"the warm-up cannot be read: {exc}") from None

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if self.errors:
            return cleaned
        template = cleaned.get("template")
        image = cleaned.get("image", "").strip()
        if template is None and not image:
            raise forms.ValidationError("Choose a template, or give an image for a custom one.")
        try:
            spec = lease_spec(
                template,
                image=image or None,
                ports=cleaned.get("ports"),
                env=cleaned.get("env") or {},
                command=cleaned.get("command"),
                warmup=cleaned.get("warmup"),
                access_protected=bool(cleaned.get("access_protected")),
            )
        except LeaseError as exc:
            raise forms.ValidationError(_sentence(str(exc))) from None
        hours = cleaned.get("keep_alive_hours")
        if hours:
            spec = dataclasses.replace(spec, stop_after=timedelta(hours=hours))
        cleaned["spec"] = spec
        return cleaned

    @property
    def spec(self) -> LeaseSpec:
        return self.cleaned_data["spec"]


def _sentence(text: str) -> str:
    text = text.strip()
    return (text[:1].upper() + text[1:]).rstrip(".") + "." if text else text


class OfferFilterForm(forms.Form):
    SORTS = [
        ("price", "Price, lowest first"),
        ("-price", "Price, highest first"),
        ("vram", "Most VRAM"),
        ("model", "Model"),
    ]
    model = forms.CharField(required=False, max_length=100, label="Model")
    min_vram_gib = forms.IntegerField(required=False, min_value=0, label="Min VRAM (GiB)")
    max_price = forms.DecimalField(
        required=False, min_value=0, decimal_places=6, label="Max price ($/h)"
    )
    sort = forms.ChoiceField(choices=SORTS, required=False)
    location = forms.CharField(required=False, max_length=64, label="Location")
    min_cpus = forms.IntegerField(required=False, min_value=0, max_value=65536, label="Min CPUs")
    min_ram_gib = forms.IntegerField(
        required=False, min_value=0, max_value=1 << 20, label="Min RAM (GiB)"
    )
    min_disk_gib = forms.IntegerField(
        required=False, min_value=0, max_value=1 << 30, label="Min free disk (GiB)"
    )
    max_rtt_ms = forms.IntegerField(
        required=False, min_value=0, max_value=600_000, label="Max round trip (ms)"
    )
    min_uptime_pct = forms.IntegerField(
        required=False, min_value=0, max_value=100, label="Min uptime (%)"
    )
    min_cuda = forms.RegexField(
        required=False, regex=r"^\d{1,3}(\.\d{1,3})?$", max_length=7, label="Min CUDA"
    )
    num_gpus = forms.IntegerField(
        required=False, min_value=1, max_value=MAX_GPUS_PER_LEASE, label="GPUs on one host"
    )
    page = forms.IntegerField(required=False, min_value=1, max_value=1000)

    def filters(self) -> dict[str, Any]:
        data = self.cleaned_data if self.is_valid() else {}
        max_price = data.get("max_price")
        return {
            "model": (data.get("model") or "").strip(),
            "min_vram_bytes": (data.get("min_vram_gib") or 0) * GIB,
            "max_price_micros": micros_from_units(max_price) if max_price is not None else None,
            "sort": data.get("sort") or "price",
            "num_gpus": data.get("num_gpus") or 1,
            "host": HostFilters(
                location=(data.get("location") or "").strip(),
                min_cpus=data.get("min_cpus") or 0,
                min_ram_bytes=(data.get("min_ram_gib") or 0) * GIB,
                min_disk_bytes=(data.get("min_disk_gib") or 0) * GIB,
                min_cuda=data.get("min_cuda") or "",
                max_rtt_ms=data.get("max_rtt_ms"),
                min_uptime=(data.get("min_uptime_pct") or 0) / 100,
            ),
        }


class GpuTermsForm(forms.Form):
    price = forms.DecimalField(
        min_value=Decimal(0),
        max_value=Decimal(1000),
        decimal_places=6,
        label="Price per GPU-hour ($)",
    )
    listed = forms.BooleanField(required=False, label="For rent")
    # Whole GiB, bounded by the service (its words, hub/lib/disk_allowance.py); left empty or
    # as shown, the allowance stays as it is.
    disk_allowance_gib = forms.IntegerField(
        required=False,
        label="Disk allowance (GiB)",
        help_text="What one rental of this GPU may write on the host (container, cache and"
        " volumes together), in GiB; the host stops it past that. Running rentals keep theirs.",
    )

    @property
    def disk_allowance_bytes(self) -> int | None:
        """The new allowance, or None when the supplier left it as it was."""
        gib = self.cleaned_data.get("disk_allowance_gib")
        if gib is None or "disk_allowance_gib" not in self.changed_data:
            return None
        return int(gib) * GIB

    @property
    def price_micros(self) -> int:
        # int() of Decimal("-0") is 0: "-0" is stored and shown as $0.00, never "$-0.00".
        return micros_from_units(self.cleaned_data["price"])


class HostDefaultPriceForm(forms.Form):
    default_price = forms.DecimalField(
        required=False,
        min_value=Decimal(0),
        max_value=Decimal(1000),
        decimal_places=6,
        label="Price for new GPUs ($/h)",
    )

    @property
    def price_micros(self) -> int | None:
        price = self.cleaned_data["default_price"]
        return None if price is None else micros_from_units(price)


class HostDetailsForm(forms.Form):
    name = forms.CharField(
        required=False,
        max_length=64,
        help_text="Empty: its hostname. The short id after it tells hosts with one name apart.",
    )
    location = forms.CharField(
        required=False,
        max_length=64,
        help_text="Country or region renters filter by, e.g. DE or US-East.",
    )

    def clean_name(self) -> str:
        return " ".join(self.cleaned_data["name"].split())

    def clean_location(self) -> str:
        return " ".join(self.cleaned_data["location"].split())


class MoneyAmountForm(forms.Form):
    amount = forms.DecimalField(
        min_value=Decimal("0.01"), max_value=Decimal(100_000), decimal_places=2, label="Amount ($)"
    )

    @property
    def amount_micros(self) -> int:
        return micros_from_units(self.cleaned_data["amount"])


class TopUpRequestForm(MoneyAmountForm):
    note = forms.CharField(
        required=False,
        max_length=500,
        label="Note for the admins",
        help_text="Optional: how you will pay, or what it is for.",
    )


class TokenForm(forms.Form):
    name = forms.CharField(
        required=False, max_length=100, help_text="To tell your tokens apart, e.g. rig-3"
    )


class ApiTokenForm(TokenForm):
    # Pre-checked: read and leases, what a script needs to rent. `tokens` is opt-in, because a
    # leaked token with it can mint a successor before it is revoked.
    scopes = forms.MultipleChoiceField(
        choices=ApiScope.choices,
        initial=list(DEFAULT_API_SCOPES),
        widget=forms.CheckboxSelectMultiple,
        error_messages={
            "required": "Choose at least one scope: a token without any can do nothing."
        },
    )


class VolumeForm(forms.Form):
    host = forms.ModelChoiceField(queryset=Host.objects.none(), empty_label=None)
    name = forms.CharField(max_length=64, help_text="e.g. models, datasets")
    size_gib = forms.IntegerField(min_value=1, label="Size (GiB)", initial=100)

    def __init__(self, *args: Any, hosts: QuerySet[Host], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["host"].queryset = hosts  # type: ignore[attr-defined]
        self.fields["size_gib"].max_value = settings.VOLUME_MAX_GIB
        self.fields["size_gib"].validators.append(MaxValueValidator(settings.VOLUME_MAX_GIB))


class SshKeyForm(forms.Form):
    # Checked by hub.accounts.ssh_keys.add_ssh_key (type, size, duplicates, the cap).
    key = forms.CharField(
        max_length=8192,
        label="Public key",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "ssh-ed25519 AAAA... you@laptop"}),
        help_text="The line in ~/.ssh/id_ed25519.pub (or id_ecdsa.pub, or an id_rsa.pub of"
        " 2048 bits or more).",
    )


class BenchmarkForm(forms.Form):
    """The lease page's benchmark: bounded by the hub's BENCH_MAX_* settings."""

    model = forms.CharField(max_length=200, help_text="as the server serves it")
    concurrency = forms.IntegerField(min_value=1, initial=1)
    isl = forms.IntegerField(min_value=1, initial=128, label="Prompt words (isl)")
    osl = forms.IntegerField(min_value=1, initial=32, label="Output tokens (osl)")
    requests = forms.IntegerField(min_value=1, initial=32)
    port = forms.TypedChoiceField(coerce=int, choices=())

    def __init__(self, *args: Any, ports: list[int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["port"].choices = [(p, str(p)) for p in ports]  # type: ignore[attr-defined]
        for name, most in benchmarks.limits().items():
            field = self.fields[name]
            field.max_value = most  # type: ignore[attr-defined]
            field.validators.append(MaxValueValidator(most))
            field.widget.attrs["max"] = most

    def ask(self) -> benchmarks.BenchmarkAsk:
        data = self.cleaned_data
        return benchmarks.BenchmarkAsk(
            model=data["model"],
            concurrency=data["concurrency"],
            isl=data["isl"],
            osl=data["osl"],
            requests=data["requests"],
            port=data["port"],
        )
