"""Which images a rental may name: registries on the supplier's own network are refused from the
text alone (hub and agent alike) and, on the agent, after resolving the registry's name."""

from __future__ import annotations

import pytest

from supplier_agent.image_policy import (
    image_env_refusal,
    registry_of,
    registry_refusal,
    resolved_refusal,
)
from supplier_agent.protocol import ProtocolError, validate_image


@pytest.mark.parametrize(
    ("image", "registry"),
    [
        ("busybox", None),
        ("pytorch/pytorch:2.5.1", None),
        ("ghcr.io/org/vllm:0.6.3", "ghcr.io"),
        ("localhost/x", "localhost"),
        ("registry:5000/x", "registry:5000"),
    ],
)
def test_the_registry_is_read_as_docker_reads_it(image: str, registry: str | None) -> None:
    assert registry_of(image) == registry


@pytest.mark.parametrize(
    ("image", "why"),
    [
        ("127.0.0.1:5000/x", "loopback"),
        ("localhost:5000/x", "single-label"),
        ("localhost/x", "single-label"),
        ("registry:5000/x", "single-label"),
        ("10.0.0.8/team/model:1", "private"),
        ("192.168.1.1/x", "private"),
        ("172.17.0.1:5000/x", "private"),
        ("100.64.0.1/x", "private"),  # carrier-grade NAT
        ("169.254.169.254/latest", "link-local"),
        ("nas.local/x", "local-network"),
        ("builder.internal:5000/x", "local-network"),
    ],
)
def test_registries_on_the_suppliers_network_are_refused_by_name(image: str, why: str) -> None:
    refusal = registry_refusal(image)
    assert refusal is not None
    assert why in refusal
    with pytest.raises(ProtocolError, match=why):
        validate_image(image)


@pytest.mark.parametrize(
    "image",
    ["busybox", "ghcr.io/org/x:1", "nvcr.io/nvidia/pytorch:24.01-py3", "8.8.8.8:5000/x"],
)
def test_public_registries_are_allowed(image: str) -> None:
    assert registry_refusal(image) is None
    assert validate_image(image) == image


def test_a_public_name_resolving_to_a_private_address_is_refused_by_the_agent() -> None:
    # The resolver is the host's DNS: a name the renter controls can point anywhere.
    refusal = resolved_refusal("models.example.com/x:1", lambda host: ["93.184.216.34", "10.1.1.1"])
    assert refusal is not None
    assert "resolves to a private address" in refusal
    assert resolved_refusal("models.example.com/x:1", lambda host: ["93.184.216.34"]) is None
    assert resolved_refusal("busybox", lambda host: ["127.0.0.1"]) is None  # Docker Hub


def test_an_unresolvable_registry_is_left_to_the_pull_to_report() -> None:
    def fail(host: str) -> list[str]:
        raise OSError("no such host")

    assert resolved_refusal("models.example.com/x:1", fail) is None


def test_loader_variables_in_an_images_config_are_refused() -> None:
    assert "LD_PRELOAD" in (image_env_refusal("x", ["PATH=/bin", "LD_PRELOAD=/a.so"]) or "")
    assert "LD_AUDIT" in (image_env_refusal("x", ["LD_AUDIT=/a.so"]) or "")
    # CUDA images set LD_LIBRARY_PATH; that is not the hook's attack vector.
    assert image_env_refusal("x", ["LD_LIBRARY_PATH=/usr/local/nvidia/lib64"]) is None
    assert image_env_refusal("x", None) is None
