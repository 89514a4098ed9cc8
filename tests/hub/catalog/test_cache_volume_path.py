"""A template's cache folder follows the mount rule of renters' volumes (issue 33): the admin who
sets it is told on the form, and a template saved before the rule is refused at rent time rather
than by the host."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from hub.catalog.models import Template
from hub.catalog.services import lease_spec
from hub.leases.services import LeaseError
from tests.hub import factories as f

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


def _template(cache_volume_path: str) -> Template:
    return Template(slug="t", name="T", image="busybox:latest", cache_volume_path=cache_volume_path)


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/etc", "is /etc, a system folder"),
        ("/proc/self", "is inside /proc"),
        ("/root/.cache/", "not in normal form"),
        ("/root/.cache\n--privileged", "control character"),
        ("cache", "not absolute"),
    ],
)
def test_a_cache_path_outside_the_rule_is_refused_on_its_field(path: str, words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        _template(path).full_clean()
    [message] = caught.value.message_dict["cache_volume_path"]
    assert message.startswith("the cache path ")
    assert words in message
    assert "e.g. /data" in message


@pytest.mark.parametrize("path", ["", "/root/.cache", "/root/.cache/huggingface", "/workspace"])
def test_ordinary_cache_paths_and_none_at_all_pass(path: str) -> None:
    _template(path).full_clean()


def test_a_form_without_the_field_does_not_trip_on_it() -> None:
    # The catalogue's editable columns (listed, position) save a template saved before the rule.
    _template("/etc").full_clean(exclude=["cache_volume_path"])


def test_the_admin_form_shows_the_refusal(admin_client: Client) -> None:
    answer = admin_client.post(
        reverse("admin:catalog_template_add"),
        {
            "slug": "etc-cache",
            "name": "Etc cache",
            "image": "busybox:latest",
            "ports": "[]",
            "env": "{}",
            "command": "null",
            "entrypoint": "null",
            "warmup": "null",
            "cache_volume_path": "/etc",
            "min_vram_bytes": "0",
            "position": "100",
        },
    )
    assert answer.status_code == 200  # the form again, not a redirect
    assert "is /etc, a system folder" in answer.content.decode()
    assert not Template.objects.filter(slug="etc-cache").exists()


def test_a_template_saved_before_the_rule_is_refused_at_rent_time() -> None:
    template = _template("/etc")
    template.save()  # as a migration or an old admin saved it: no full_clean
    with pytest.raises(LeaseError, match="cache folder no host accepts"):
        lease_spec(template)
