"""What one registration costs Postgres: a small number of statements, the same whatever the
fleet's size or the host's GPU count (a reconnect storm is thousands of registrations a
minute, issue 18). Counted with Django's CaptureQueriesContext; the transaction's own
savepoints are not statements of the registration's logic and are left out."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from hub.agents import registration
from hub.catalog import prepull
from hub.suppliers.models import AgentToken, Gpu, Host
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

# The budget: token, the host's locked row, its write, one GPU upsert, absent GPUs, leases,
# pending volume deletes. A new host: token, host lookup, cap check, insert, transition, GPUs.
MAX_RECONNECT_STATEMENTS = 7
MAX_NEW_HOST_STATEMENTS = 6


@pytest.fixture(autouse=True)
def _own_redis_keys_and_a_warm_ranking() -> Iterator[None]:
    # The catalogue's pre-pull ranking is cached per process (RANKING_TTL_S): two statements
    # once per five minutes, not per registration. Warmed here so that every count below is a
    # registration's own, in any test order.
    prepull.clear_ranking()
    prepull.images_fitting(0)
    with f.private_redis_keys():
        yield
    prepull.clear_ranking()


def _statements(token: AgentToken, agent_id: str, gpus: int) -> list[str]:
    message = f.register_message(agent_id, gpus=range(gpus))
    with CaptureQueriesContext(connection) as captured:
        registration.register_host(token.pk, message, f"chan-{uuid.uuid4().hex}")
    return [
        q["sql"]
        for q in captured.captured_queries
        if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))
    ]


def _grow_fleet(token: AgentToken, hosts: int) -> None:
    for _ in range(hosts):
        f.register_host(token, gpus=[0, 1])


@pytest.mark.parametrize("gpus", [1, 8])
def test_a_reconnect_costs_the_same_few_statements_whatever_the_fleet(gpus: int) -> None:
    token, _ = f.make_token()
    agent_id = str(uuid.uuid4())
    f.register_host(token, agent_id=agent_id, gpus=range(gpus))
    alone = _statements(token, agent_id, gpus)

    _grow_fleet(token, 40)
    in_a_fleet = _statements(token, agent_id, gpus)

    assert len(alone) <= MAX_RECONNECT_STATEMENTS, alone
    assert len(in_a_fleet) == len(alone), in_a_fleet


def test_a_reconnect_costs_the_same_with_one_gpu_or_eight() -> None:
    token, _ = f.make_token()
    small, big = str(uuid.uuid4()), str(uuid.uuid4())
    f.register_host(token, agent_id=small, gpus=[0])
    f.register_host(token, agent_id=big, gpus=range(8))

    assert len(_statements(token, small, 1)) == len(_statements(token, big, 8))
    # All eight came back through the one upsert, none left absent.
    assert Gpu.objects.filter(host__agent_id=big, present=True).count() == 8


def test_a_new_host_costs_a_bounded_number_of_statements_whatever_the_fleet() -> None:
    token, _ = f.make_token()
    first = _statements(token, str(uuid.uuid4()), 1)
    _grow_fleet(token, 40)
    later = _statements(token, str(uuid.uuid4()), 8)

    assert len(first) <= MAX_NEW_HOST_STATEMENTS, first
    assert len(later) == len(first), later


def test_the_prepull_answer_costs_no_statement_of_its_own() -> None:
    token, _ = f.make_token()
    agent_id = str(uuid.uuid4())
    f.register_host(token, agent_id=agent_id, gpus=[0])

    statements = _statements(token, agent_id, 1)

    # images_for's aggregate over the host's GPUs is gone: the reported GPUs give the VRAM.
    assert not any("MAX(" in sql.upper() for sql in statements), statements


# --- a batch of registrations (registration_batch.py, as a reconnect storm brings them) --------


def _batch(requests: list[registration.Request]) -> tuple[list[str], registration.BatchResult]:
    with CaptureQueriesContext(connection) as captured:
        result = registration.register_many(requests)
    statements = [
        q["sql"]
        for q in captured.captured_queries
        if not q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))
    ]
    return statements, result


def _reconnects(token: AgentToken, hosts: int, gpus: int = 1) -> list[registration.Request]:
    agent_ids = [str(uuid.uuid4()) for _ in range(hosts)]
    for agent_id in agent_ids:
        f.register_host(token, agent_id=agent_id, gpus=range(gpus), channel_name=f"old-{agent_id}")
    return [
        registration.Request(token.pk, f.register_message(a, gpus=range(gpus)), f"c-{a}")
        for a in agent_ids
    ]


def test_a_batch_of_reconnects_costs_the_same_few_statements_for_one_host_or_thirty() -> None:
    token, _ = f.make_token()
    one, _ = _batch(_reconnects(token, 1))
    thirty, result = _batch(_reconnects(token, 30, gpus=4))

    assert len(one) <= MAX_RECONNECT_STATEMENTS, one
    assert len(thirty) == len(one), thirty
    assert all(isinstance(o, registration.Registered) for o in result.outcomes)


def test_a_batch_answers_each_request_as_register_host_would() -> None:
    token, _ = f.make_token()
    back = _reconnects(token, 2, gpus=2)
    # One of them now reports one GPU fewer.
    back[1] = registration.Request(
        token.pk, f.register_message(back[1].message.agent_id, gpus=[0]), back[1].channel_name
    )
    new = registration.Request(token.pk, f.register_message(), "c-new")
    theirs = f.register_host()  # another supplier's host
    stranger = registration.Request(token.pk, f.register_message(str(theirs.agent_id)), "c-x")

    _, result = _batch([*back, new, stranger])

    first, second, joined, refused = result.outcomes
    assert isinstance(first, registration.Registered)
    assert isinstance(second, registration.Registered)
    assert isinstance(joined, registration.Registered)  # a new host: register_host's path
    assert isinstance(refused, registration.RegistrationRefused)  # another supplier's id
    assert Host.objects.get(pk=first.host_id).channel_name == back[0].channel_name
    assert dict(Gpu.objects.filter(host_id=second.host_id).values_list("index", "present")) == {
        0: True,
        1: False,
    }
    assert Host.objects.get(pk=joined.host_id).status == Host.Status.ONLINE
    # The sockets these registrations replaced are named for the caller to tell.
    assert sorted(result.superseded) == sorted(f"old-{r.message.agent_id}" for r in back)


def test_a_batch_keeps_the_machine_facts_a_reconnect_reports() -> None:
    """Issue 20's host details go through the batch's one UPDATE too (and an older agent's
    register, without them, leaves them unknown)."""
    token, _ = f.make_token()
    back = _reconnects(token, 2)
    newer = dataclasses.replace(
        back[0].message, disk_free_bytes=321 * 1024**3, driver_version="560.35", cuda_version="12.6"
    )
    _, result = _batch([dataclasses.replace(back[0], message=newer), back[1]])
    first, second = result.outcomes
    assert isinstance(first, registration.Registered)
    assert isinstance(second, registration.Registered)
    facts = Host.objects.values_list("disk_free_bytes", "driver_version", "cuda_version")
    assert facts.get(pk=first.host_id) == (321 * 1024**3, "560.35", "12.6")
    assert facts.get(pk=second.host_id) == (None, "", "")
