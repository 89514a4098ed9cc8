"""Hosts are told to pre-pull the catalogue's most rented images that fit them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hub.agents import registration
from hub.catalog import prepull
from hub.catalog.models import Template
from hub.catalog.prepull import images_for
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

GIB = 1 << 30


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    prepull.clear_ranking()
    with f.private_liveness_set() as key:
        yield key
    prepull.clear_ranking()


def _rent(images: list[str], *, fresh_ranking: bool = True) -> None:
    host = f.register_host(gpus=range(len(images)))  # registering ranks (and caches) too
    for index, image in enumerate(images):
        f.start_lease(host, [index], image=image)
    if fresh_ranking:
        prepull.clear_ranking()


def test_the_most_rented_fitting_catalogue_images_are_pulled_ahead(settings: object) -> None:
    vllm = Template.objects.get(slug="vllm-openai").image  # needs 16 GiB
    jupyter = Template.objects.get(slug="pytorch-jupyterlab").image  # needs 8 GiB
    ubuntu = Template.objects.get(slug="ubuntu-ssh").image
    _rent([vllm, vllm, vllm, jupyter, jupyter, ubuntu, "someone/private-image:1"])

    big = f.register_host(gpus=(f.gpu_state(0, memory_total_bytes=80 * GIB),))
    assert images_for(big.pk) == (vllm, jupyter, ubuntu)  # never the private image
    small = f.register_host(gpus=(f.gpu_state(0, memory_total_bytes=12 * GIB),))
    assert images_for(small.pk) == (jupyter, ubuntu)  # vLLM needs more VRAM than it has

    settings.PREPULL_IMAGES = 1  # type: ignore[attr-defined]
    assert images_for(big.pk) == (vllm,)
    settings.PREPULL_IMAGES = 0  # type: ignore[attr-defined]
    assert images_for(big.pk) == ()


def test_registration_hands_the_list_to_the_agent() -> None:
    jupyter = Template.objects.get(slug="pytorch-jupyterlab").image
    _rent([jupyter])
    token, _ = f.make_token()
    message = f.register_message(None, gpus=(f.gpu_state(0, memory_total_bytes=24 * GIB),))
    registered = registration.register_host(token.pk, message, "")
    assert registered.prepull_images == (jupyter,)


def test_the_ranking_is_computed_once_for_many_registrations() -> None:
    jupyter = Template.objects.get(slug="pytorch-jupyterlab").image
    ubuntu = Template.objects.get(slug="ubuntu-ssh").image
    _rent([jupyter, jupyter, ubuntu])
    host = f.register_host(gpus=(f.gpu_state(0, memory_total_bytes=24 * GIB),))
    assert images_for(host.pk) == (jupyter, ubuntu)

    _rent([ubuntu, ubuntu], fresh_ranking=False)  # ubuntu is now the most rented...
    assert images_for(host.pk) == (jupyter, ubuntu)  # ...but the cached ranking stands

    prepull.clear_ranking()
    assert images_for(host.pk) == (ubuntu, jupyter)
