"""Content-Security-Policy (issue 14 item 11): every response says scripts come only from the
hub itself, and no template holds a script the policy would block (an inline one would mean
either a broken page or a policy loosened to let it run)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import Client

from tests.hub import factories as f

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[3]
TEMPLATE_DIRS = [ROOT / "templates", *sorted((ROOT / "hub").glob("*/templates"))]
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*application/json)[^>]*>", re.I)
HANDLER = re.compile(r"\son[a-z]+\s*=", re.I)
JS_URL = re.compile(r"""(?:href|src|action)\s*=\s*["']?\s*javascript:""", re.I)


def _script_src(policy: str) -> str:
    directives = {}
    for part in policy.split(";"):
        name, _, value = part.strip().partition(" ")
        directives[name] = value
    return directives.get("script-src", directives.get("default-src", ""))


@pytest.mark.parametrize(
    "path", ["/", "/login/", "/offers/", "/leases/", "/admin/login/", "/api/v1/offers/", "/nope/"]
)
def test_every_response_allows_scripts_from_the_hub_only(path: str) -> None:
    client = Client()
    client.force_login(f.make_user("renter"))
    response = client.get(path)
    policy = response["Content-Security-Policy"]
    scripts = _script_src(policy)
    assert scripts == "'self'", policy
    assert "unsafe-inline" not in scripts
    assert "unsafe-eval" not in scripts
    assert "frame-ancestors 'none'" in policy
    assert "object-src 'none'" in policy


def test_no_template_holds_an_inline_script_or_handler() -> None:
    templates = [p for d in TEMPLATE_DIRS for p in d.rglob("*.html")]
    assert len(templates) > 20  # the scan sees the dashboard's templates
    offenders = []
    for template in templates:
        text = template.read_text()
        for pattern in (INLINE_SCRIPT, HANDLER, JS_URL):
            offenders += [
                f"{template.relative_to(ROOT)}: {m.group(0)}" for m in pattern.finditer(text)
            ]
    assert offenders == []


def test_the_scan_would_see_an_inline_script() -> None:
    assert INLINE_SCRIPT.search("<script>alert(1)</script>")
    assert INLINE_SCRIPT.search('<script type="module">x</script>')
    assert not INLINE_SCRIPT.search('<script src="/static/web/live.js" defer></script>')
    assert not INLINE_SCRIPT.search('<script type="application/json" id="d">{}</script>')
    assert HANDLER.search('<img src=x onerror="alert(1)">')
    assert JS_URL.search('<a href="javascript:alert(1)">')
