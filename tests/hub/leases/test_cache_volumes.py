"""Cache volumes belong to one renter: two renters of one template on one host never share one."""

from __future__ import annotations

import json
import re

import pytest

from hub.leases.models import Command
from hub.suppliers.models import Host
from supplier_agent.protocol import HUB_TO_AGENT, DockerRun, parse_message
from tests.hub import factories as f

CACHE = {"name": "template-comfyui", "path": "/root"}


@pytest.fixture
def host(db: None) -> Host:
    return f.register_host(gpus=[0, 1, 2])


def _sent_volume(lease_id: object) -> tuple[str, str]:
    command = Command.objects.get(lease_id=lease_id, kind=Command.Kind.DOCKER_RUN)
    message = parse_message(json.dumps(command.payload), allowed=HUB_TO_AGENT)
    assert isinstance(message, DockerRun)
    assert message.cache_volume is not None
    return message.cache_volume.name, message.cache_volume.path


def test_two_renters_of_one_template_get_volumes_of_their_own(host: Host) -> None:
    alice, bob = f.make_user("alice"), f.make_user("bob")

    first = f.run_lease(host, [0], renter=alice, cache_volume=CACHE)
    second = f.run_lease(host, [1], renter=bob, cache_volume=CACHE)

    names = {_sent_volume(first.pk)[0], _sent_volume(second.pk)[0]}
    assert len(names) == 2
    assert _sent_volume(first.pk)[1] == "/root"
    for name in names:
        # A keyed hash: nothing the supplier could read a renter from, never the shared name.
        assert re.fullmatch(r"renter-[0-9a-f]{40}", name)


def test_a_renter_finds_their_cache_again_on_the_next_lease(host: Host) -> None:
    renter = f.make_user("carol")

    first = f.run_lease(host, [0], renter=renter, cache_volume=CACHE)
    again = f.run_lease(host, [1], renter=renter, cache_volume=CACHE)
    other_template = f.run_lease(
        host, [2], renter=renter, cache_volume={"name": "template-vllm", "path": "/root/.cache"}
    )

    assert _sent_volume(first.pk)[0] == _sent_volume(again.pk)[0]
    assert _sent_volume(other_template.pk)[0] != _sent_volume(first.pk)[0]
