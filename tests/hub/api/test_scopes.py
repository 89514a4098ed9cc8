"""API token scopes, tried as an attacker holding a leaked token would try them (issue 14 item 8).

A token does only what its scopes allow; a token never mints one stronger than itself; the
dashboard session has every scope; and every API view declares its scopes, or nobody gets in.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.test import APIClient, APIRequestFactory
from rest_framework.views import APIView

from hub.accounts.api_tokens import (
    ScopeEscalation,
    UnknownScope,
    authenticate_api_token,
    create_api_token,
)
from hub.accounts.models import ApiScope, ApiToken, User
from hub.api.permissions import HasScope, required_scope
from hub.leases.models import Command, Lease
from hub.suppliers.models import Gpu, Host
from tests.hub import factories as f
from tests.hub.api.conftest import client_for, top_up

pytestmark = pytest.mark.django_db

ALL = ["read", "leases", "tokens"]
# The only API views that need no credentials: they describe the API and hold no data.
PUBLIC = {"api:schema", "api:docs"}


# --- the URL conf ---------------------------------------------------------------------------------


def drf_views() -> list[tuple[str, dict[str, Any], APIView]]:
    """Every DRF view anywhere in the URL conf: (namespaced name, path converters, instance)."""
    found = []

    def walk(patterns: Iterable[Any], namespace: str, converters: dict[str, Any]) -> None:
        for entry in patterns:
            known = {**converters, **getattr(entry.pattern, "converters", {})}
            if isinstance(entry, URLResolver):
                inner = ":".join(n for n in (namespace, entry.namespace or "") if n)
                walk(entry.url_patterns, inner, known)
            elif isinstance(entry, URLPattern):
                view_class = getattr(entry.callback, "cls", None)
                if isinstance(view_class, type) and issubclass(view_class, APIView):
                    view = view_class(**entry.callback.initkwargs)
                    found.append((f"{namespace}:{entry.name}", known, view))

    walk(get_resolver().url_patterns, "", {})
    return found


def own_methods(view: APIView) -> list[str]:
    """The methods a view answers itself, OPTIONS and HEAD (which follow GET) aside."""
    return [m for m in view._allowed_methods() if m not in {"OPTIONS", "HEAD"}]


def test_every_api_view_declares_a_scope_for_each_of_its_methods() -> None:
    views = drf_views()
    assert len(views) >= 12  # the walk found the API, not an empty list
    declared: set[ApiScope] = set()
    for name, _, view in views:
        permissions = view.get_permissions()
        if not permissions:
            assert name in PUBLIC, f"{name} lets anyone in: list it in PUBLIC on purpose"
            assert not view.get_authenticators()
            continue
        assert any(isinstance(p, HasScope) for p in permissions), f"{name} skips HasScope"
        assert own_methods(view), name
        for method in own_methods(view):
            scope = required_scope(view, method)
            assert scope in ApiScope.values, f"{method} {name} declares no scope"
            declared.add(scope)
    assert declared == set(ApiScope)


def test_a_method_without_a_declared_scope_is_refused_even_with_every_scope(
    renter: User,
) -> None:
    class Undeclared(APIView):
        required_scopes = {"GET": ApiScope.READ}

        def get(self, request: Any) -> Any:
            raise AssertionError("never reached")

        def post(self, request: Any) -> Any:
            raise AssertionError("never reached: POST declares no scope")

    _, plaintext = create_api_token(renter, "all", ALL)
    request = APIRequestFactory().post("/x", HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    response = Undeclared.as_view()(request)
    assert response.status_code == 403
    assert "declares no API scope" in response.data["detail"]


# --- tokens without the scope -------------------------------------------------------------------


@pytest.fixture
def host() -> Host:
    return f.register_host(gpus=(0, 1))


@pytest.fixture
def lease(renter: User, host: Host) -> Lease:
    return f.start_lease(host, [0], renter=renter, access_protected=True)


def _volume_of(lease: Lease) -> Any:
    from hub.volumes.services import create_volume

    volume = lease.renter.volumes.filter(label="scoped").first()
    return volume or create_volume(lease.renter, lease.host, "scoped", 1)


def _gpu_of(renter: User) -> Gpu:
    """A GPU of the renter's own (a renter may supply too): the supplier's GPU routes."""
    gpu = Gpu.objects.filter(host__owner=renter).first()
    return gpu or f.register_host(f.make_token(renter)[0]).gpus.get()


def concrete(name: str, converters: dict[str, Any], lease: Lease, token: ApiToken) -> str:
    # Each uuid route names its own kind of object: a lease's, or a volume's; int ones a
    # token's, or a GPU's.
    uuid = _volume_of(lease).pk if name == "api:volume" else lease.pk
    number = _gpu_of(lease.renter).pk if name == "api:gpu" else token.pk
    values = {"uuid": uuid, "int": number, "slug": "pytorch-jupyterlab"}
    kwargs = {
        key: values[type(c).__name__.removesuffix("Converter").lower()]
        for key, c in converters.items()
    }
    return reverse(name, kwargs=kwargs)


def every_call(lease: Lease, victim: ApiToken) -> list[tuple[str, str]]:
    """(method, path) for every method of every scoped API view, HEAD and OPTIONS included."""
    calls = []
    for name, converters, view in drf_views():
        if name in PUBLIC:
            continue
        path = concrete(name, converters, lease, victim)
        methods = view._allowed_methods()
        # Django answers HEAD with GET once a request sets the view up; here it is not set up.
        methods += ["HEAD"] if "GET" in methods and "HEAD" not in methods else []
        calls += [(method, path) for method in methods]
    return calls


def call(client: APIClient, method: str, path: str) -> Any:
    return client.generic(method, path, "{}", content_type="application/json")


def test_a_token_without_scopes_can_do_nothing(renter: User, lease: Lease) -> None:
    victim, _ = create_api_token(renter, "victim", ALL)
    empty = client_for(renter, [])
    calls = every_call(lease, victim)
    assert len(calls) >= 20
    for method, path in calls:
        response = call(empty, method, path)
        assert response.status_code == 403, (method, path, response.status_code)
        if method != "HEAD":
            assert "lacks the '" in response.json()["detail"], (method, path)
    victim.refresh_from_db()
    assert victim.active
    lease.refresh_from_db()
    assert lease.state == Lease.State.RESERVING
    assert ApiToken.objects.filter(user=renter).count() == 2


def test_a_read_token_reads_but_changes_nothing_and_never_sees_tokens(
    renter: User, lease: Lease
) -> None:
    victim, _ = create_api_token(renter, "victim", ALL)
    reader = client_for(renter, ["read"])
    for method, path in every_call(lease, victim):
        response = call(reader, method, path)
        if method in {"GET", "HEAD", "OPTIONS"} and "/tokens/" not in path:
            assert response.status_code == 200, (method, path, response.status_code)
        elif method == "OPTIONS":
            assert response.status_code == 200  # describes the endpoint, lists nothing
            assert victim.prefix not in response.content.decode()
        else:
            assert response.status_code == 403, (method, path, response.status_code)
            if method != "HEAD":
                assert response.json()["detail"].startswith("this API token lacks the '")
                assert victim.prefix not in response.content.decode()
    victim.refresh_from_db()
    assert victim.active
    lease.refresh_from_db()
    assert lease.state == Lease.State.RESERVING
    assert ApiToken.objects.filter(user=renter).count() == 2


def test_a_read_token_cannot_rent_even_with_a_valid_order(renter: User, host: Host) -> None:
    top_up(renter, 10_000_000)
    gpu = Gpu.objects.get(host=host, index=1)
    order = {"gpu_ids": [gpu.pk], "image": f.TEST_IMAGE}
    response = client_for(renter, ["read"]).post("/api/v1/leases/", order, format="json")
    assert response.status_code == 403
    assert response.json() == {
        "detail": "this API token lacks the 'leases' scope that POST needs here; create a token"
        " with 'leases' on the API tokens page"
    }
    assert not Lease.objects.filter(renter=renter).exists()
    # The same order with `leases` goes through: the scope, not the order, stopped it.
    assert client_for(renter).post("/api/v1/leases/", order, format="json").status_code == 201


def test_a_read_token_cannot_stop_a_lease_or_open_its_urls(renter: User, lease: Lease) -> None:
    reader = client_for(renter, ["read"])
    assert reader.post(f"/api/v1/leases/{lease.pk}/stop/").status_code == 403
    assert reader.post(f"/api/v1/leases/{lease.pk}/access-token/").status_code == 403
    assert not Command.objects.filter(lease=lease, kind=Command.Kind.RELEASE).exists()
    assert reader.get(f"/api/v1/leases/{lease.pk}/").json()["state"] == "reserving"


def test_a_leases_token_cannot_list_mint_or_revoke_tokens(renter: User) -> None:
    leaked = client_for(renter)  # the default scopes: read and leases
    other, _ = create_api_token(renter, "other", ALL)
    listed = leaked.get("/api/v1/tokens/")
    assert listed.status_code == 403
    assert other.prefix not in listed.content.decode()
    for body in ({}, {"scopes": ["read"]}, {"scopes": ["read", "leases"]}, {"scopes": ALL}):
        minted = leaked.post("/api/v1/tokens/", {"name": "successor", **body}, format="json")
        assert minted.status_code == 403, body
        assert "'tokens' scope" in minted.json()["detail"]
        assert "cgpr_" not in minted.content.decode()
    assert leaked.delete(f"/api/v1/tokens/{other.pk}/").status_code == 403
    other.refresh_from_db()
    assert other.active
    assert not ApiToken.objects.filter(user=renter, name="successor").exists()


@pytest.mark.parametrize(
    ("own", "asked", "missing"),
    [
        (["tokens"], ["tokens", "leases"], "'leases'"),
        (["tokens"], ALL, "'read', 'leases'"),
        (["tokens"], None, "'read', 'leases'"),  # the default would be an escalation too
        (["read", "tokens"], ["read", "leases"], "'leases'"),
        (["leases", "tokens"], ["read", "tokens"], "'read'"),
    ],
)
def test_a_tokens_token_cannot_mint_a_token_with_more_scopes_than_its_own(
    renter: User, own: list[str], asked: list[str] | None, missing: str
) -> None:
    minter = client_for(renter, own)
    body: dict[str, Any] = {"name": "stronger"}
    if asked is not None:
        body["scopes"] = asked
    response = minter.post("/api/v1/tokens/", body, format="json")
    assert response.status_code == 403
    assert response.json()["detail"].startswith(f"this API token cannot grant {missing}:")
    assert not ApiToken.objects.filter(name="stronger").exists()


def test_a_tokens_token_mints_tokens_within_its_own_scopes(renter: User) -> None:
    minter = client_for(renter, ["read", "tokens"])
    response = minter.post("/api/v1/tokens/", {"scopes": ["tokens", "read"]}, format="json")
    assert response.status_code == 201
    assert response.json()["scopes"] == ["read", "tokens"]
    narrower = minter.post("/api/v1/tokens/", {"scopes": ["read"]}, format="json").json()
    assert ApiToken.objects.get(pk=narrower["id"]).scopes == ["read"]
    assert [t["scopes"] for t in minter.get("/api/v1/tokens/").json()] == [
        ["read"],
        ["read", "tokens"],
        ["read", "tokens"],
    ]


@pytest.mark.parametrize(
    "scopes", [["admin"], ["read", "READ"], [], "read", ["read"] * 4, [None], ["tokens "]]
)
def test_unknown_or_malformed_scopes_are_400(renter: User, scopes: Any) -> None:
    response = client_for(renter, ALL).post(
        "/api/v1/tokens/", {"name": "odd", "scopes": scopes}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["detail"].startswith("scopes")
    assert not ApiToken.objects.filter(name="odd").exists()


def test_the_dashboard_session_has_every_scope(renter: User, lease: Lease) -> None:
    session = APIClient()
    session.force_login(renter)
    created = session.post("/api/v1/tokens/", {"scopes": ALL}, format="json")
    assert created.status_code == 201
    assert created.json()["scopes"] == ALL
    assert session.get("/api/v1/tokens/").status_code == 200
    assert session.post(f"/api/v1/leases/{lease.pk}/stop/").status_code == 200


def test_revoking_a_leaked_token_ends_its_access_at_once(renter: User, lease: Lease) -> None:
    token, plaintext = create_api_token(renter, "leaked", ALL)
    leaked = APIClient()
    leaked.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert leaked.get(f"/api/v1/leases/{lease.pk}/").status_code == 200

    owner = APIClient()
    owner.force_login(renter)
    assert owner.delete(f"/api/v1/tokens/{token.pk}/").status_code == 204

    assert leaked.get(f"/api/v1/leases/{lease.pk}/").status_code == 401
    assert leaked.post("/api/v1/tokens/", {"scopes": ["read"]}, format="json").status_code == 401
    assert leaked.post(f"/api/v1/leases/{lease.pk}/stop/").status_code == 401
    assert ApiToken.objects.filter(user=renter, revoked_at__isnull=True).count() == 0


# --- the service and the table ------------------------------------------------------------------


def test_new_tokens_default_to_read_and_leases(renter: User) -> None:
    token, _ = create_api_token(renter)
    assert ApiToken.objects.get(pk=token.pk).scopes == ["read", "leases"]


def test_the_service_refuses_unknown_scopes_and_escalation(renter: User) -> None:
    with pytest.raises(UnknownScope, match="unknown scope 'admin': choose from read, leases"):
        create_api_token(renter, scopes=["read", "admin"])
    reader, _ = create_api_token(renter, scopes=["read", "tokens"])
    with pytest.raises(ScopeEscalation, match="cannot grant 'leases'"):
        create_api_token(renter, scopes=["leases"], created_by=reader)
    assert ApiToken.objects.filter(user=renter).count() == 1


def test_the_database_refuses_a_scope_the_code_does_not_know(renter: User) -> None:
    token, plaintext = create_api_token(renter, scopes=["read"])
    with pytest.raises(IntegrityError), transaction.atomic():
        ApiToken.objects.filter(pk=token.pk).update(scopes=["read", "root"])
    live = authenticate_api_token(plaintext)
    assert live is not None
    assert live.scopes == ["read"]


# --- the schema ---------------------------------------------------------------------------------


def test_the_schema_names_each_operation_s_scope(client: Any) -> None:
    schema = client.get("/api/schema/?format=json").json()
    scheme = schema["components"]["securitySchemes"]["apiToken"]["description"]
    assert all(scope in scheme for scope in ALL)
    needed = {
        (method.upper(), path): operation["x-required-scope"]
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if "403" in operation["responses"]
    }
    operations = [(m.upper(), p) for p, item in schema["paths"].items() for m in item]
    assert sorted(needed) == sorted(operations)
    assert needed[("GET", "/api/v1/tokens/")] == "tokens"
    assert needed[("POST", "/api/v1/tokens/")] == "tokens"
    assert needed[("DELETE", "/api/v1/tokens/{id}/")] == "tokens"
    assert needed[("POST", "/api/v1/leases/")] == "leases"
    assert needed[("POST", "/api/v1/leases/{id}/stop/")] == "leases"
    assert needed[("GET", "/api/v1/leases/")] == "read"
    assert needed[("GET", "/api/v1/offers/")] == "read"
    lease_create = schema["paths"]["/api/v1/leases/"]["post"]["description"]
    assert "Needs the `leases` scope" in lease_create
