"""The offers filter syntax (`gpu=4090 vram>=24 price<=1.5`) mapped to the API's query params.

Each field allows only the operators its query param means: `min_*` params are `>=`,
`max_*` ones `<=`, so `vram<=24` is refused rather than silently read as a minimum."""

from __future__ import annotations

import re
from dataclasses import dataclass

from cloudgpu_cli.errors import USAGE, CliError


@dataclass(frozen=True)
class Field:
    param: str
    operators: tuple[str, ...]
    # "text", "number" (decimal: price), "int" (the API's integer params), "version"
    kind: str


FIELDS: dict[str, Field] = {
    "gpu": Field("model", ("=",), "text"),
    "location": Field("location", ("=",), "text"),
    "vram": Field("min_vram_gib", (">=",), "int"),
    "price": Field("max_price", ("<=",), "number"),
    # The API's num_gpus is both: hosts with at least N free, priced for renting N together.
    "num_gpus": Field("num_gpus", (">=", "="), "int"),
    "cpus": Field("min_cpus", (">=",), "int"),
    "ram": Field("min_ram_gib", (">=",), "int"),
    "disk": Field("min_disk_gib", (">=",), "int"),
    "cuda": Field("min_cuda", (">=",), "version"),
    "rtt": Field("max_rtt_ms", ("<=",), "int"),
    "uptime": Field("min_uptime_pct", (">=",), "int"),
}
ALIASES = {"model": "gpu"}

_TERM = re.compile(r"^\s*([A-Za-z_]+)\s*(>=|<=|==|=)\s*(.*?)\s*$")
_NUMBER = re.compile(r"^\d+(\.\d+)?$")
_INT = re.compile(r"^\d+$")
_VERSION = re.compile(r"^\d+(\.\d+){0,2}$")


def _bad(message: str) -> CliError:
    return CliError(f"bad filter: {message}", USAGE)


def parse_one(term: str) -> tuple[str, str]:
    match = _TERM.match(term)
    if not match:
        raise _bad(f"{term!r} is not FIELD OP VALUE (e.g. vram>=24)")
    name, op, value = match.group(1).lower(), match.group(2), match.group(3)
    op = "=" if op == "==" else op
    name = ALIASES.get(name, name)
    field = FIELDS.get(name)
    if field is None:
        raise _bad(f"unknown field {name!r} (fields: {', '.join(FIELDS)})")
    if op not in field.operators:
        raise _bad(f"{name} takes {' or '.join(field.operators)}, not {op}")
    if not value:
        raise _bad(f"{term!r} has no value")
    checks = {"number": (_NUMBER, "a number"), "int": (_INT, "a whole number")}
    checks["version"] = (_VERSION, "a version like 12.4")
    if field.kind in checks:
        pattern, what = checks[field.kind]
        if not pattern.match(value):
            raise _bad(f"{name} needs {what}, not {value!r}")
    return field.param, value


def to_params(terms: list[str]) -> dict[str, str]:
    """Query params for GET /api/v1/offers/, one term per argument (a location may hold
    spaces: `"location=US West"`)."""
    params: dict[str, str] = {}
    for term in terms:
        param, value = parse_one(term)
        if param in params and params[param] != value:
            raise _bad(f"{term!r} contradicts an earlier filter on the same field")
        params[param] = value
    return params
