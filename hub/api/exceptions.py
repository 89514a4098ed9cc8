"""One error shape for every API error: ``{"detail": "...", "errors": {...}}``.

``detail`` is always a sentence a person can read; ``errors`` (bad input only) keeps DRF's
per-field messages for programs.
"""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from hub.accounts.ssh_keys import SshKeyError
from hub.billing.money import format_rate
from hub.billing.services import BillingError
from hub.leases.services import LeaseError, PriceChanged
from hub.suppliers.services import SupplierError
from hub.volumes.services import VolumeError


def _flatten(errors: Any, path: str = "") -> list[str]:
    if isinstance(errors, dict):
        return [m for key, value in errors.items() for m in _flatten(value, _join(path, key))]
    if isinstance(errors, list):
        found = []
        for n, value in enumerate(errors):
            found += _flatten(
                value, _join(path, str(n)) if isinstance(value, dict | list) else path
            )
        return found
    return [
        f"{path}: {errors}" if path and path not in {"non_field_errors", "input"} else str(errors)
    ]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def handle(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, PriceChanged):
        # 409: the request was fine, the offer changed under it; the client shows the new
        # price and rents again only if the renter accepts it.
        return Response(
            {
                "detail": str(exc),
                "price_per_hour": format_rate(exc.price_per_hour_micros),
                "price_per_hour_micros": exc.price_per_hour_micros,
            },
            status=status.HTTP_409_CONFLICT,
        )
    if isinstance(exc, LeaseError | VolumeError | SshKeyError | BillingError | SupplierError):
        # The services' refusals are written for the renter (or supplier) already.
        return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
    response = exception_handler(exc, context)
    if response is not None and isinstance(exc, exceptions.ValidationError):
        errors = response.data if isinstance(response.data, dict) else {"input": response.data}
        response.data = {"detail": "; ".join(_flatten(errors)), "errors": errors}
    return response
