"""The renter's REST API, v1. Views are thin: they check input with a serializer, call one
service, and answer with a serializer. Another renter's objects answer 404, never 403, so that
an id reveals nothing."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.conf import settings
from django.db.models import OuterRef, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from hub.accounts import api_tokens, ssh_keys
from hub.accounts.models import ApiScope, ApiToken, SshKey
from hub.api import serializers as s
from hub.benchmarks import services as benchmarks
from hub.benchmarks.models import BenchmarkRun
from hub.billing import payouts, topups
from hub.billing import services as billing
from hub.billing.models import LedgerEntry, Payout, TopUpRequest
from hub.billing.money import micros_from_units
from hub.catalog import offers
from hub.catalog.models import Template
from hub.catalog.services import lease_spec, with_account_keys
from hub.leases import gpu_choice
from hub.leases import logs as lease_logs
from hub.leases import services as leases
from hub.leases.models import Lease
from hub.suppliers import services as suppliers
from hub.suppliers.models import Gpu, Host
from hub.tunnels import access
from hub.volumes import services as volumes
from hub.volumes.models import Volume

GIB = 1 << 30
LEDGER_ROWS = 20
PAYOUT_ROWS = 50
TOP_UP_ROWS = 50

ERRORS = {
    400: OpenApiResponse(s.ErrorSerializer, description="Bad input, or the service refused."),
    401: OpenApiResponse(s.ErrorSerializer, description="No valid credentials."),
}
NOT_FOUND = {404: OpenApiResponse(s.ErrorSerializer, description="Not found (or not yours).")}
AUTH_ONLY = {401: ERRORS[401]}
PRICE_CHANGED = {
    409: OpenApiResponse(
        s.PriceChangedSerializer,
        description="A GPU costs more than `max_price_per_hour` now; nothing was rented.",
    )
}


# --- tokens -------------------------------------------------------------------------------------


class ApiTokenList(APIView):
    # Listing needs `tokens` too, not `read`: a read-only token must not even enumerate them.
    required_scopes = {"GET": ApiScope.TOKENS, "POST": ApiScope.TOKENS}

    @extend_schema(
        summary="Your API tokens, newest first (revoked ones too)",
        responses={200: s.ApiTokenSerializer(many=True), **AUTH_ONLY},
    )
    def get(self, request: Request) -> Response:
        tokens = ApiToken.objects.filter(user=request.user)
        return Response(s.ApiTokenSerializer(tokens, many=True).data)

    @extend_schema(
        summary="Create an API token (its plaintext is shown this once)",
        request=s.ApiTokenCreateSerializer,
        responses={
            201: s.ApiTokenCreatedSerializer,
            **ERRORS,
            403: OpenApiResponse(
                s.ErrorSerializer,
                description="The token lacks `tokens`, or asked for a scope it lacks itself.",
            ),
        },
    )
    def post(self, request: Request) -> Response:
        data = _valid(s.ApiTokenCreateSerializer, request.data)
        creator = request.auth if isinstance(request.auth, ApiToken) else None
        try:
            token, plaintext = api_tokens.create_api_token(
                request.user, data["name"], data["scopes"], created_by=creator
            )
        except api_tokens.ScopeEscalation as refused:
            raise PermissionDenied(str(refused)) from None
        token.token = plaintext  # type: ignore[attr-defined]
        return Response(s.ApiTokenCreatedSerializer(token).data, status=status.HTTP_201_CREATED)


class ApiTokenDetail(APIView):
    required_scopes = {"DELETE": ApiScope.TOKENS}

    @extend_schema(
        summary="Revoke an API token (requests with it fail from now on)",
        responses={204: None, **AUTH_ONLY, **NOT_FOUND},
    )
    def delete(self, request: Request, pk: int) -> Response:
        token = get_object_or_404(ApiToken, pk=pk, user=request.user)
        api_tokens.revoke_api_token(request.user, token.pk)
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- SSH keys -----------------------------------------------------------------------------------


class SshKeyList(APIView):
    # Adding a key opens the renter's running leases' ports through the gateway: `leases`, like
    # their access tokens. Reading them is `read`.
    required_scopes = {"GET": ApiScope.READ, "POST": ApiScope.LEASES}

    @extend_schema(
        summary="Your SSH public keys, newest first",
        responses={200: s.SshKeySerializer(many=True), **AUTH_ONLY},
    )
    def get(self, request: Request) -> Response:
        keys = SshKey.objects.filter(user=request.user)
        return Response(s.SshKeySerializer(keys, many=True).data)

    @extend_schema(
        summary="Add an SSH public key",
        description=(
            "The key opens your running leases' declared ports through the tunnel gateway"
            " (`ssh -J` / `ssh -L`; each lease's `ssh` says how), and goes into templates that"
            f" take your keys. At most {ssh_keys.MAX_PER_ACCOUNT} keys; a key already on an"
            " account is refused."
        ),
        request=s.SshKeyCreateSerializer,
        responses={201: s.SshKeySerializer, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        data = _valid(s.SshKeyCreateSerializer, request.data)
        key = ssh_keys.add_ssh_key(request.user, data["public_key"])
        return Response(s.SshKeySerializer(key).data, status=status.HTTP_201_CREATED)


class SshKeyDetail(APIView):
    required_scopes = {"DELETE": ApiScope.LEASES}

    @extend_schema(
        summary="Delete an SSH key (the gateway refuses it from the next login)",
        responses={204: None, **AUTH_ONLY, **NOT_FOUND},
    )
    def delete(self, request: Request, pk: int) -> Response:
        key = get_object_or_404(SshKey, pk=pk, user=request.user)
        ssh_keys.delete_ssh_key(request.user, key.pk)
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- catalogue ----------------------------------------------------------------------------------


class OfferList(APIView):
    required_scopes = {"GET": ApiScope.READ}

    @extend_schema(
        summary="GPUs that can be rented right now",
        parameters=[s.OfferQuerySerializer],
        responses={200: s.OfferSerializer(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        query = _valid(s.OfferQuerySerializer, request.query_params)
        max_price = query.get("max_price")
        try:
            found = offers.list_offers(
                model=query.get("model", ""),
                min_vram_bytes=query.get("min_vram_gib", 0) * GIB,
                max_price_micros=None if max_price is None else micros_from_units(max_price),
                sort=query["sort"],
                host=offers.HostFilters(
                    location=query.get("location", "").strip(),
                    min_cpus=query.get("min_cpus", 0),
                    min_ram_bytes=query.get("min_ram_gib", 0) * GIB,
                    min_disk_bytes=query.get("min_disk_gib", 0) * GIB,
                    min_cuda=query.get("min_cuda", ""),
                    max_rtt_ms=query.get("max_rtt_ms"),
                    min_uptime=query.get("min_uptime_pct", 0) / 100,
                ),
                num_gpus=query["num_gpus"],
                limit=query["limit"] + 1,  # one more: is there a next page?
                offset=query["offset"],
                after=query["after"],
            )
        except offers.CursorError as exc:
            raise ValidationError({"after": [str(exc)]}) from None
        page = found[: query["limit"]]
        response = Response(s.OfferSerializer(page, many=True).data)
        if len(found) > query["limit"]:
            following = request.query_params.copy()
            following["limit"] = str(query["limit"])
            cursor = offers.cursor_after(page[-1], query["sort"])
            if cursor is not None:
                following.pop("offset", None)
                following["after"] = cursor
            else:
                following["offset"] = str(query["offset"] + query["limit"])
            url = request.build_absolute_uri(f"{request.path}?{following.urlencode()}")
            response["Link"] = f'<{url}>; rel="next"'
        return response


class TemplateList(APIView):
    required_scopes = {"GET": ApiScope.READ}

    @extend_schema(
        summary="Templates in the catalogue",
        responses={200: s.TemplateSerializer(many=True), **AUTH_ONLY},
    )
    def get(self, request: Request) -> Response:
        templates = Template.objects.filter(listed=True)
        return Response(s.TemplateSerializer(templates, many=True).data)


class TemplateDetail(APIView):
    required_scopes = {"GET": ApiScope.READ}

    @extend_schema(
        summary="One template",
        responses={200: s.TemplateSerializer, **AUTH_ONLY, **NOT_FOUND},
    )
    def get(self, request: Request, slug: str) -> Response:
        template = get_object_or_404(Template, slug=slug, listed=True)
        return Response(s.TemplateSerializer(template).data)


# --- leases -------------------------------------------------------------------------------------


def renters_leases(request: Request) -> QuerySet[Lease]:
    charged = (
        LedgerEntry.objects.filter(
            lease=OuterRef("pk"), account=OuterRef("renter"), kind=LedgerEntry.Kind.CHARGE
        )
        .values("lease")
        .annotate(total=Sum("amount_micros"))
        .values("total")[:1]
    )
    return (
        Lease.objects.filter(renter=request.user)
        .select_related("host")
        .prefetch_related("lease_gpus__gpu", "tunnels")
        # Charges are negative ledger rows: the cost so far is their sum, negated.
        .annotate(cost_micros=-Coalesce(Subquery(charged), Value(0)))
    )


class LeasePagination(LimitOffsetPagination):
    default_limit = 50
    max_limit = 200


class LeaseList(generics.GenericAPIView):
    required_scopes = {"GET": ApiScope.READ, "POST": ApiScope.LEASES}
    pagination_class = LeasePagination
    serializer_class = s.LeaseSerializer

    def get_queryset(self) -> QuerySet[Lease]:
        return renters_leases(self.request)

    @extend_schema(
        summary="Your leases, newest first",
        responses={200: s.LeaseSerializer(many=True), **AUTH_ONLY},
    )
    def get(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(s.LeaseSerializer(page, many=True).data)

    @extend_schema(
        summary="Rent GPUs: start a lease",
        description=(
            "Choose GPUs by the offers' `gpu_ids`, by `host_id` and `gpu_indices`, or by a"
            " `gpus` selection (`all`, `count=N`, indices, NVML UUIDs); choose"
            " what runs by a `template` slug and/or a custom `image` (with `ports`, `env`,"
            " `command`). Refusals (GPU just taken, host offline, out of funds, bad image) are"
            " 400 with a `detail` to show the renter. With `max_price_per_hour`, a price"
            " raised above it since is 409 with the new `price_per_hour` (and"
            " `price_per_hour_micros`); nothing is rented."
        ),
        request=s.LeaseCreateSerializer,
        responses={201: s.LeaseSerializer, **ERRORS, **PRICE_CHANGED},
    )
    def post(self, request: Request) -> Response:
        data = _valid(s.LeaseCreateSerializer, request.data)
        host, gpu_indices = _chosen_gpus(data)
        if host is None and data.get("volumes"):
            raise ValidationError({"volumes": ["volumes live on one host: give `host_id`"]})
        template = None
        if data.get("template"):
            template = Template.objects.filter(slug=data["template"], listed=True).first()
            if template is None:
                raise ValidationError({"template": [f"no template {data['template']!r}"]})
        spec = lease_spec(
            template,
            image=data.get("image"),
            ports=data.get("ports"),
            env=data.get("env"),
            command=data.get("command"),
            warmup=data.get("warmup"),
            access_protected=data["access_protected"],
        )
        spec = with_account_keys(spec, template, request.user)
        if data.get("volumes"):
            mounts = volumes.mounts_for_lease(
                request.user, host, [(m["volume_id"], m["path"]) for m in data["volumes"]]
            )
            spec = dataclasses.replace(spec, volumes=volumes.wire_mounts(mounts))
        max_price = data.get("max_price_per_hour")
        max_micros = None if max_price is None else micros_from_units(max_price)
        if "gpus" in data:
            lease = gpu_choice.start_lease_on(
                request.user,
                data["gpus"],
                spec,
                host=host,
                model=data.get("gpu_model"),
                max_price_per_hour_micros=max_micros,
            )
        else:
            assert host is not None  # gpu_ids and gpu_indices always name a host
            lease = leases.start_lease(
                request.user, host, gpu_indices, spec, max_price_per_hour_micros=max_micros
            )
        return Response(
            s.LeaseSerializer(renters_leases(request).get(pk=lease.pk)).data,
            status=status.HTTP_201_CREATED,
        )


def _chosen_gpus(data: dict[str, Any]) -> tuple[Host | None, list[int]]:
    """The host and indices named by ``gpu_ids`` or ``gpu_indices``; for a ``gpus`` selection,
    the host if ``host_id`` names one (gpu_choice picks the indices when renting)."""
    if "gpu_ids" in data:
        ids = data["gpu_ids"]
        if len(set(ids)) != len(ids):
            raise ValidationError({"gpu_ids": ["a GPU is listed twice"]})
        gpus = list(Gpu.objects.select_related("host").filter(pk__in=ids))
        missing = sorted(set(ids) - {g.pk for g in gpus})
        if missing:
            raise ValidationError({"gpu_ids": [f"no GPU with id {missing[0]}"]})
        if len({g.host_id for g in gpus}) != 1:
            raise ValidationError({"gpu_ids": ["the GPUs of one lease must be on one host"]})
        return gpus[0].host, [g.index for g in gpus]
    if "host_id" not in data:
        return None, []
    host = Host.objects.filter(pk=data["host_id"]).first()
    if host is None:
        raise ValidationError({"host_id": [f"no host with id {data['host_id']}"]})
    return host, list(data.get("gpu_indices", []))


class LeaseDetail(APIView):
    required_scopes = {"GET": ApiScope.READ}

    @extend_schema(
        summary="One lease: state, URLs, cost so far",
        responses={200: s.LeaseSerializer, **AUTH_ONLY, **NOT_FOUND},
    )
    def get(self, request: Request, pk: str) -> Response:
        return Response(s.LeaseSerializer(get_object_or_404(renters_leases(request), pk=pk)).data)


class LeaseStop(APIView):
    required_scopes = {"POST": ApiScope.LEASES}

    @extend_schema(
        summary="Stop a lease (billing stops now; the host then removes the container)",
        request=None,
        responses={200: s.LeaseSerializer, **AUTH_ONLY, **NOT_FOUND},
    )
    def post(self, request: Request, pk: str) -> Response:
        lease = get_object_or_404(renters_leases(request), pk=pk)
        leases.release_lease(lease.pk, Lease.EndReason.RENTER_STOP)
        return Response(s.LeaseSerializer(renters_leases(request).get(pk=lease.pk)).data)


class LeaseLogs(APIView):
    required_scopes = {"GET": ApiScope.READ}

    @extend_schema(
        summary="What the hub has of a lease's logs",
        description=(
            "`log` is the recent live output the hub kept while the lease's logs were followed"
            " (on its page, or over the dashboard's live socket); `log_tail` is the end of the"
            " output the agent reported when the container exited or failed."
        ),
        responses={200: s.LeaseLogsSerializer, **AUTH_ONLY, **NOT_FOUND},
    )
    def get(self, request: Request, pk: str) -> Response:
        lease = get_object_or_404(Lease.objects.filter(renter=request.user), pk=pk)
        text = lease_logs.backlog_text(str(lease.pk))
        lease.log = ""  # type: ignore[attr-defined]
        lease.streamed = bool(text)  # type: ignore[attr-defined]
        # The text goes in after serializing: a serializer is a cycle (its fields point back at
        # it, it keeps its arguments), so whatever it holds waits for a full collection.
        body = dict(s.LeaseLogsSerializer(lease).data)
        body["log"] = text
        return Response(body)

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().dispatch(request, *args, **kwargs)
        # DRF links the view, its Request and the Response both ways (parser_context and
        # renderer_context name the view, the view names both): the lot, with up to 3 MiB of
        # log text and its rendered body, waited for a full collection, which big strings never
        # bring on; the web process grew ~100 MiB/h under this endpoint (issue 23). Render now
        # (Django would, next) and cut the links, so reference counting frees it on return.
        if isinstance(response, Response):
            response.render()
            response.renderer_context = {}
            response.data = None
        drf_request = getattr(self, "request", None)
        if isinstance(drf_request, Request):
            drf_request.parser_context = {}
        self.__dict__.pop("response", None)
        self.__dict__.pop("request", None)
        return response


class LeaseAccessToken(APIView):
    required_scopes = {"POST": ApiScope.LEASES}

    @extend_schema(
        summary="An access token for a protected lease's URLs",
        request=None,
        responses={200: s.AccessTokenSerializer, **ERRORS, **NOT_FOUND},
    )
    def post(self, request: Request, pk: str) -> Response:
        lease = get_object_or_404(renters_leases(request), pk=pk)
        if not lease.access_protected:
            raise leases.LeaseError("this lease's URLs are not protected: they need no token")
        if not lease.active:
            raise leases.LeaseError("this lease has ended: its URLs are closed")
        body = {
            "token": access.issue(lease.pk),
            "header": access.HEADER,
            "cookie": access.COOKIE,
            "expires_in_s": settings.TUNNEL_ACCESS_TOKEN_MAX_AGE_S,
            "urls": lease.tunnels.all(),
        }
        return Response(s.AccessTokenSerializer(body).data)


# --- account ------------------------------------------------------------------------------------


class Account(APIView):
    required_scopes = {"GET": ApiScope.READ}

    @extend_schema(
        summary="Your balance and recent ledger rows",
        responses={200: s.AccountSerializer, **AUTH_ONLY},
    )
    def get(self, request: Request) -> Response:
        body = {
            "username": request.user.get_username(),
            "balance_micros": billing.balance_micros(request.user),
            "ledger": LedgerEntry.objects.filter(account=request.user)[:LEDGER_ROWS],
        }
        return Response(s.AccountSerializer(body).data)


# --- a supplier's GPUs ---------------------------------------------------------------------------


def _own_gpus(request: Request) -> QuerySet[Gpu]:
    return (
        Gpu.objects.filter(host__owner=request.user)
        .select_related("host")
        .order_by("host_id", "index")
    )


class GpuList(APIView):
    required_scopes = {"GET": ApiScope.READ}

    @extend_schema(
        summary="Your hosts' GPUs and their terms: price, listing, disk allowance",
        responses={200: s.GpuTermsSerializer(many=True), **AUTH_ONLY},
    )
    def get(self, request: Request) -> Response:
        return Response(s.GpuTermsSerializer(_own_gpus(request)[:1000], many=True).data)


class GpuDetail(APIView):
    # Opt-in like `payouts`: terms change what renters pay and what they may write on the host.
    required_scopes = {"GET": ApiScope.READ, "PATCH": ApiScope.HOSTS}

    @extend_schema(
        summary="One of your GPUs and its terms",
        responses={200: s.GpuTermsSerializer, **AUTH_ONLY, **NOT_FOUND},
    )
    def get(self, request: Request, pk: int) -> Response:
        return Response(s.GpuTermsSerializer(get_object_or_404(_own_gpus(request), pk=pk)).data)

    @extend_schema(
        summary="Set your GPU's price, listing or disk allowance (what you leave out stays)",
        description=(
            "Rentals running now keep the price and disk allowance they started with; new"
            " rentals get the new terms. A GPU is listed only once it has a price."
        ),
        request=s.GpuTermsUpdateSerializer,
        responses={200: s.GpuTermsSerializer, **ERRORS, **NOT_FOUND},
    )
    def patch(self, request: Request, pk: int) -> Response:
        gpu = get_object_or_404(_own_gpus(request), pk=pk)
        data = _valid(s.GpuTermsUpdateSerializer, request.data)
        price = data.get("price_per_hour")
        gib = data.get("disk_allowance_gib")
        suppliers.set_gpu_terms(
            gpu.pk,
            price_per_hour_micros=None if price is None else micros_from_units(price),
            listed=data.get("listed"),
            disk_allowance_bytes=None if gib is None else gib * GIB,
        )
        return Response(s.GpuTermsSerializer(_own_gpus(request).get(pk=gpu.pk)).data)


# --- payouts ------------------------------------------------------------------------------------


def _payouts_body(request: Request) -> dict[str, Any]:
    return {
        "payable_micros": payouts.payable_micros(request.user),
        "minimum_micros": settings.PAYOUT_MINIMUM_MICROS,
        "payouts": Payout.objects.filter(account=request.user)[:PAYOUT_ROWS],
    }


class PayoutList(APIView):
    # Asking for money to leave the marketplace is its own opt-in scope (like `tokens`).
    required_scopes = {"GET": ApiScope.READ, "POST": ApiScope.PAYOUTS}

    @extend_schema(
        summary="Your payable balance and payouts",
        responses={200: s.PayoutsSerializer, **AUTH_ONLY},
    )
    def get(self, request: Request) -> Response:
        return Response(s.PayoutsSerializer(_payouts_body(request)).data)

    @extend_schema(
        summary="Request a payout of your earnings (an admin sends it and marks it paid)",
        request=s.PayoutRequestSerializer,
        responses={201: s.PayoutSerializer, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        data = _valid(s.PayoutRequestSerializer, request.data)
        payout = payouts.request_payout(request.user, micros_from_units(data["amount"]))
        return Response(s.PayoutSerializer(payout).data, status=status.HTTP_201_CREATED)


class PayoutCancel(APIView):
    required_scopes = {"POST": ApiScope.PAYOUTS}

    @extend_schema(
        summary="Cancel a payout you requested and that is not paid yet",
        request=None,
        responses={200: s.PayoutSerializer, **AUTH_ONLY, **NOT_FOUND},
    )
    def post(self, request: Request, pk: int) -> Response:
        payout = get_object_or_404(Payout, pk=pk, account=request.user)
        if not payouts.cancel_payout(payout.pk, request.user):
            raise ValidationError({"detail": f"payout {payout.pk} is {payout.state} already"})
        payout.refresh_from_db()
        return Response(s.PayoutSerializer(payout).data)


class TopUpList(APIView):
    # Asking is harmless to a leaked token's holder (an admin decides, at most
    # topups.MAX_WAITING wait at once), and it is part of renting: the `leases` scope.
    required_scopes = {"GET": ApiScope.READ, "POST": ApiScope.LEASES}

    @extend_schema(
        summary="Your top-up requests, newest first",
        responses={200: s.TopUpRequestSerializer(many=True), **AUTH_ONLY},
    )
    def get(self, request: Request) -> Response:
        rows = TopUpRequest.objects.filter(account=request.user)[:TOP_UP_ROWS]
        return Response(s.TopUpRequestSerializer(rows, many=True).data)

    @extend_schema(
        summary="Ask for funds (no payment processor yet: an admin adds them to your balance)",
        request=s.TopUpAskSerializer,
        responses={201: s.TopUpRequestSerializer, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        data = _valid(s.TopUpAskSerializer, request.data)
        asked = topups.request_top_up(
            request.user, micros_from_units(data["amount"]), data.get("note", "")
        )
        return Response(s.TopUpRequestSerializer(asked).data, status=status.HTTP_201_CREATED)


class LeaseBenchmarks(APIView):
    required_scopes = {"GET": ApiScope.READ, "POST": ApiScope.LEASES}

    @extend_schema(
        summary="A lease's benchmark runs, newest first",
        responses={200: s.BenchmarkRunSerializer(many=True), **AUTH_ONLY, **NOT_FOUND},
    )
    def get(self, request: Request, pk: str) -> Response:
        lease = get_object_or_404(Lease.objects.filter(renter=request.user), pk=pk)
        runs = BenchmarkRun.objects.filter(lease=lease)[: settings.BENCH_RUNS_KEPT]
        return Response(s.BenchmarkRunSerializer(runs, many=True).data)

    @extend_schema(
        summary="Benchmark a running lease's URL (cloudgpu-agent bench, run by the hub)",
        description=(
            "The hub's worker streams completions from the lease's own URL (one of its ports;"
            " never another address) and keeps the figures on the run. One run at a time per"
            " lease, within the hub's bounds (BENCH_MAX_*), each at most BENCH_MAX_DURATION_S."
        ),
        request=s.BenchmarkCreateSerializer,
        responses={202: s.BenchmarkRunSerializer, **ERRORS, **NOT_FOUND},
    )
    def post(self, request: Request, pk: str) -> Response:
        data = _valid(s.BenchmarkCreateSerializer, request.data)
        ask = benchmarks.BenchmarkAsk(**data)
        try:
            run = benchmarks.request_benchmark(request.user, pk, ask)
        except benchmarks.NoSuchLease:
            raise NotFound("no such lease") from None
        except benchmarks.BenchmarkRefused as exc:
            raise ValidationError({"input": [str(exc)]}) from None
        return Response(s.BenchmarkRunSerializer(run).data, status=status.HTTP_202_ACCEPTED)


def _valid(serializer_class: type[Any], data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


# --- volumes --------------------------------------------------------------------------------


def _renters_volumes(request: Request) -> QuerySet[Volume]:
    return Volume.objects.filter(renter=request.user).select_related("host")


class VolumeList(APIView):
    required_scopes = {"GET": ApiScope.READ, "POST": ApiScope.LEASES}

    @extend_schema(
        summary="Your volumes and template caches, newest first (removed ones say why)",
        responses={200: s.VolumeSerializer(many=True), **AUTH_ONLY},
    )
    def get(self, request: Request) -> Response:
        return Response(s.VolumeSerializer(_renters_volumes(request)[:500], many=True).data)

    @extend_schema(
        summary="Create a volume on a host (it takes space there once a rental mounts it)",
        description=(
            "Mount it with `volumes` when you rent GPUs of that host. Its size is checked by"
            " the host's hourly measurement: a volume over its size mounts into no new rental."
            " Volumes unused for the host's idle limit (14 days by default), or the oldest when"
            " the host's disk runs low, are removed; their `removed_reason` says so."
        ),
        request=s.VolumeCreateSerializer,
        responses={201: s.VolumeSerializer, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        data = _valid(s.VolumeCreateSerializer, request.data)
        host = Host.objects.filter(pk=data["host_id"]).first()
        if host is None:
            raise ValidationError({"host_id": [f"no host with id {data['host_id']}"]})
        volume = volumes.create_volume(request.user, host, data["name"], data["size_gib"])
        return Response(
            s.VolumeSerializer(_renters_volumes(request).get(pk=volume.pk)).data,
            status=status.HTTP_201_CREATED,
        )


class VolumeDetail(APIView):
    required_scopes = {"GET": ApiScope.READ, "PATCH": ApiScope.LEASES, "DELETE": ApiScope.LEASES}

    @extend_schema(
        summary="Give a volume a new size (the way back for one over its size)",
        request=s.VolumeResizeSerializer,
        responses={200: s.VolumeSerializer, **ERRORS, **NOT_FOUND},
    )
    def patch(self, request: Request, pk: str) -> Response:
        data = _valid(s.VolumeResizeSerializer, request.data)
        volume = get_object_or_404(_renters_volumes(request), pk=pk)
        volumes.resize_volume(request.user, volume.pk, data["size_gib"])
        return Response(s.VolumeSerializer(_renters_volumes(request).get(pk=volume.pk)).data)

    @extend_schema(
        summary="One volume: size, usage, state",
        responses={200: s.VolumeSerializer, **AUTH_ONLY, **NOT_FOUND},
    )
    def get(self, request: Request, pk: str) -> Response:
        return Response(
            s.VolumeSerializer(get_object_or_404(_renters_volumes(request), pk=pk)).data
        )

    @extend_schema(
        summary="Delete a volume and its files (refused while a rental of yours mounts it)",
        responses={200: s.VolumeSerializer, **ERRORS, **NOT_FOUND},
    )
    def delete(self, request: Request, pk: str) -> Response:
        volume = get_object_or_404(_renters_volumes(request), pk=pk)
        volumes.delete_volume(request.user, volume.pk)
        return Response(s.VolumeSerializer(_renters_volumes(request).get(pk=volume.pk)).data)
