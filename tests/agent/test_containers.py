"""The agent's container runtime against the real Docker engine, with the local busybox image."""

from __future__ import annotations

import contextlib
import io
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import docker
import httpx
import pytest
from docker.errors import APIError, NotFound

from supplier_agent import containers
from supplier_agent.containers import (
    RENTAL_CAPS,
    ClaimedContainer,
    ContainerError,
    ContainerRuntime,
    nvidia_runtime_available,
)
from supplier_agent.protocol import CacheVolume, DockerRun, RenterVolume
from tests.support.container_specs import HTTPD, SpecFactory, cache_name, lease_containers
from tests.support.docker_cleanup import TEST_IMAGE_LABEL, remove_volume
from tests.support.polling import wait_for

pytestmark = pytest.mark.docker


@pytest.fixture
def runtime(docker_client: Any) -> ContainerRuntime:
    # busybox's PID 1 ignores SIGTERM: a short grace keeps removals quick.
    return ContainerRuntime(
        docker_client, gpu_devices="none", stop_grace_s=1, allow_local_images=True
    )


def _refused(runtime: ContainerRuntime, spec: DockerRun, agent_id: str, match: str) -> None:
    """The run is refused with that reason, and leaves no container behind."""
    with pytest.raises(ContainerError, match=match):
        runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)
    assert lease_containers(runtime.client, spec.lease_id) == []


class _ExitReports(dict[str, int]):
    """{lease_id: exit_code} as watch_exits reports them; ``in`` takes in new reports first."""

    def __init__(self) -> None:
        super().__init__()
        self.inbox: queue.SimpleQueue[tuple[str, int]] = queue.SimpleQueue()

    def __contains__(self, lease_id: object) -> bool:
        while not self.inbox.empty():
            reported, code = self.inbox.get()
            self[reported] = code
        return super().__contains__(lease_id)


@contextlib.contextmanager
def _watching(runtime: ContainerRuntime) -> Iterator[_ExitReports]:
    """Run watch_exits in a thread for the block; it must return once told to stop."""
    reports = _ExitReports()
    stop = threading.Event()
    thread = threading.Thread(
        target=runtime.watch_exits,
        args=(lambda lease_id, code: reports.inbox.put((lease_id, code)), stop),
        kwargs={"since": time.time()},
    )
    thread.start()
    try:
        yield reports
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive(), "watch_exits did not return once stop_event was set"


def test_run_serves_http_on_a_loopback_host_port(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str
) -> None:
    spec = make_spec()

    result = runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)

    assert set(result.ports) == {8080}
    # run() returns only once the server answers, so a single request must succeed.
    page = httpx.get(f"http://127.0.0.1:{result.ports[8080]}/", timeout=5)
    assert page.text.strip() == spec.lease_id


def test_container_is_hardened_and_labelled(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str, docker_client: Any
) -> None:
    spec = make_spec()

    result = runtime.run(spec, [2, 5], agent_id=agent_id, ready_timeout_s=30)

    inspect = docker_client.api.inspect_container(result.container_id)
    host = inspect["HostConfig"]
    assert inspect["Name"] == f"/cloudgpu-{spec.lease_id}"
    assert host["Privileged"] is False
    assert host["NetworkMode"] == "cloudgpu"
    assert list(inspect["NetworkSettings"]["Networks"]) == ["cloudgpu"]
    assert host["PidMode"] != "host"
    assert host["IpcMode"] != "host"
    assert host["SecurityOpt"] == ["no-new-privileges:true"]
    assert host["PidsLimit"] == 4096
    assert host["ShmSize"] == 8 * 1024**3
    assert host["CapDrop"] == ["ALL"]
    assert sorted(c.removeprefix("CAP_") for c in host["CapAdd"]) == sorted(RENTAL_CAPS)
    assert host["RestartPolicy"]["Name"] == "no"
    assert host["PortBindings"] == {"8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": ""}]}
    assert all(
        binding["HostIp"] == "127.0.0.1"
        for bindings in inspect["NetworkSettings"]["Ports"].values()
        for binding in bindings
    )
    assert not host["Binds"]
    assert [(m["Type"], m["Name"], m["Destination"]) for m in inspect["Mounts"]] == [
        ("volume", f"cloudgpu-cache-{cache_name(agent_id)}", "/cache")
    ]
    assert not host["DeviceRequests"]  # gpu_devices="none"
    # Less the test image's own label, which Docker copies onto every container of it.
    labels = {k: v for k, v in inspect["Config"]["Labels"].items() if k != TEST_IMAGE_LABEL}
    assert labels == {
        "cloudgpu.claim": agent_id,
        "cloudgpu.lease": spec.lease_id,
        "cloudgpu.ports": "8080",
        "cloudgpu.gpus": "2,5",
        "cloudgpu.image.digest": docker_client.images.get(spec.image).id,
        "cloudgpu.disk.allowance": str(50 * 1024**3),  # the default: the spec names none
    }


def test_create_requests_exactly_the_claimed_gpus(
    docker_client: Any, make_spec: SpecFactory, agent_id: str
) -> None:
    gpu_runtime = ContainerRuntime(docker_client, gpu_devices="nvidia", allow_local_images=True)

    container_id = gpu_runtime.create(make_spec(), [1, 3], agent_id=agent_id)

    requests = docker_client.api.inspect_container(container_id)["HostConfig"]["DeviceRequests"]
    assert [(r["Driver"], r["DeviceIDs"], r["Capabilities"]) for r in requests] == [
        ("nvidia", ["1", "3"], [["gpu"]])
    ]


def _env(docker_client: Any, container_id: str) -> dict[str, str]:
    lines = docker_client.api.inspect_container(container_id)["Config"]["Env"]
    return dict(line.split("=", 1) for line in lines)


@pytest.fixture
def image_with_env(docker_client: Any, busybox_image: str) -> Iterator[Callable[[str], str]]:
    """Builds a local image from the test image with extra ENV lines; removed afterwards."""
    tags: list[str] = []

    def build(env_lines: str) -> str:
        tag = f"cloudgpu-test/env-{uuid.uuid4().hex[:8]}:latest"
        dockerfile = f"FROM {busybox_image}\n{env_lines}\n".encode()
        docker_client.images.build(fileobj=io.BytesIO(dockerfile), tag=tag, rm=True)
        tags.append(tag)
        return tag

    yield build
    for tag in tags:
        with contextlib.suppress(NotFound, APIError):
            docker_client.images.remove(tag, force=True)


def test_the_claimed_gpus_are_named_by_uuid_over_what_the_image_says(
    docker_client: Any,
    make_spec: SpecFactory,
    agent_id: str,
    image_with_env: Callable[[str], str],
) -> None:
    # CUDA images say NVIDIA_VISIBLE_DEVICES=all; with the NVIDIA runtime as dockerd's default
    # that alone would hand the container every GPU of the host.
    image = image_with_env("ENV NVIDIA_VISIBLE_DEVICES=all")
    uuids = ["GPU-00000000-0000-0000-0000-000000000001", "GPU-00000000-0000-0000-0000-000000000003"]
    gpu_runtime = ContainerRuntime(docker_client, gpu_devices="nvidia", allow_local_images=True)

    container_id = gpu_runtime.create(
        make_spec(image=image), [1, 3], agent_id=agent_id, gpu_uuids=uuids
    )

    requests = docker_client.api.inspect_container(container_id)["HostConfig"]["DeviceRequests"]
    assert [r["DeviceIDs"] for r in requests] == [uuids]
    assert _env(docker_client, container_id)["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)


def test_a_container_without_gpus_gets_none_whatever_the_image_says(
    runtime: ContainerRuntime,
    docker_client: Any,
    make_spec: SpecFactory,
    agent_id: str,
    image_with_env: Callable[[str], str],
) -> None:
    image = image_with_env("ENV NVIDIA_VISIBLE_DEVICES=all")

    container_id = runtime.create(make_spec(image=image), [0], agent_id=agent_id)

    assert _env(docker_client, container_id)["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_an_image_whose_config_sets_ld_preload_is_refused(
    runtime: ContainerRuntime,
    docker_client: Any,
    make_spec: SpecFactory,
    agent_id: str,
    image_with_env: Callable[[str], str],
) -> None:
    spec = make_spec(image=image_with_env("ENV LD_PRELOAD=/lib/libhook.so"))

    _refused(runtime, spec, agent_id, "sets LD_PRELOAD")


@pytest.mark.parametrize("registry_host", ["127.0.0.1", "localhost"])
def test_an_image_on_the_suppliers_loopback_is_refused_before_any_connection(
    runtime: ContainerRuntime,
    docker_client: Any,
    make_spec: SpecFactory,
    agent_id: str,
    registry_host: str,
) -> None:
    # A "registry" the supplier's dockerd would reach: it must never hear from it.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        port = listener.getsockname()[1]
        spec = make_spec(image=f"{registry_host}:{port}/renter/probe:1")

        with pytest.raises(ContainerError, match="rentals may pull only from public registries"):
            runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)

        with pytest.raises(BlockingIOError):
            listener.accept()
    assert lease_containers(docker_client, spec.lease_id) == []


def test_a_container_found_running_warms_up_again_before_it_counts_as_running(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str, docker_client: Any
) -> None:
    # As after a kill -9 of the agent mid-warm-up: the container runs, its warm-up never ended,
    # and the hub sends the unacknowledged docker_run again.
    spec = make_spec(warmup=("sh", "-c", "echo warm >> /www/warmups; exit 5"))
    container_id = runtime.create(spec, [0], agent_id=agent_id)
    runtime.start(container_id)

    with pytest.raises(ContainerError, match="exit code 5"):
        runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)

    container = docker_client.containers.get(container_id)
    assert container.exec_run(["cat", "/www/warmups"]).output.decode().split() == ["warm"]


def test_start_without_the_nvidia_toolkit_says_to_install_it(
    docker_client: Any, make_spec: SpecFactory, agent_id: str
) -> None:
    if nvidia_runtime_available(docker_client):
        pytest.skip("this Docker can give containers GPUs")
    gpu_runtime = ContainerRuntime(docker_client, gpu_devices="nvidia", allow_local_images=True)
    container_id = gpu_runtime.create(make_spec(), [1, 3], agent_id=agent_id)

    with pytest.raises(ContainerError, match="install nvidia-container-toolkit"):
        gpu_runtime.start(container_id)


def test_running_a_lease_twice_leaves_one_container(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str, docker_client: Any
) -> None:
    spec = make_spec()

    first = runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)
    second = runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)

    assert second == first
    assert [c.id for c in lease_containers(docker_client, spec.lease_id)] == [first.container_id]


def test_missing_image_fails_and_leaves_no_container(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str, docker_client: Any
) -> None:
    spec = make_spec(image="cloudgpu-test/does-not-exist:1")

    with pytest.raises(ContainerError, match="cloudgpu-test/does-not-exist:1"):
        runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)

    assert lease_containers(docker_client, spec.lease_id) == []


def test_forbidden_env_is_refused_again_before_docker(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str, docker_client: Any
) -> None:
    _refused(runtime, make_spec(env={"LD_PRELOAD": "/tmp/evil.so"}), agent_id, "LD_PRELOAD")


def test_warm_up_runs_inside_the_container_before_run_returns(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str
) -> None:
    spec = make_spec(warmup=("sh", "-c", "echo warm > /www/warm.html"))

    result = runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)

    page = httpx.get(f"http://127.0.0.1:{result.ports[8080]}/warm.html", timeout=5)
    assert page.text.strip() == "warm"


def test_warm_up_output_is_handed_over_while_it_runs(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str, docker_client: Any
) -> None:
    # The warm-up waits for a file the test makes only once its first line has arrived: that
    # line came while the warm-up ran, not with its end.
    script = "echo first; while [ ! -e /www/go ]; do sleep 0.1; done; echo second"
    spec = make_spec(warmup=("sh", "-c", script))
    received: queue.Queue[bytes] = queue.Queue()
    seen: list[bytes] = []

    def text() -> str:
        while not received.empty():
            seen.append(received.get())
        return b"".join(seen).decode()

    with ThreadPoolExecutor(1) as pool:
        started = pool.submit(
            runtime.run,
            spec,
            [0],
            agent_id=agent_id,
            ready_timeout_s=60,
            warmup_output=received.put,
        )
        wait_for(lambda: "\nfirst\n" in text(), timeout_s=60, what="the warm-up's first line")
        assert not started.done()
        assert "\nsecond\n" not in text()
        container = lease_containers(docker_client, spec.lease_id)[0]
        container.exec_run(["touch", "/www/go"])
        started.result(timeout=60)

    assert text() == f"[warm-up] sh -c '{script}'\nfirst\nsecond\n[warm-up] finished\n"


def test_failing_warm_up_removes_the_container(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str, docker_client: Any
) -> None:
    spec = make_spec(warmup=("sh", "-c", "echo still cold; exit 3"))

    with pytest.raises(ContainerError, match=r"exit code 3(?s:.*)still cold"):
        runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)

    assert lease_containers(docker_client, spec.lease_id) == []


def test_container_exiting_before_its_port_answers_fails_with_code_and_logs(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str, docker_client: Any
) -> None:
    spec = make_spec(command=("sh", "-c", "echo crashed on purpose; exit 4"))

    with pytest.raises(ContainerError, match=r"code 4(?s:.*)crashed on purpose"):
        runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)

    assert lease_containers(docker_client, spec.lease_id) == []


def test_port_that_never_answers_times_out(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str
) -> None:
    # Docker's userland proxy accepts on the host port even with nothing listening inside.
    spec = make_spec(command=("sleep", "120"))

    with pytest.raises(ContainerError, match="port 8080 did not accept connections within 2 s"):
        runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=2)


def test_watch_exits_reports_a_container_that_exits_on_its_own(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str
) -> None:
    spec = make_spec(ports=(), command=("sh", "-c", "exit 7"))

    with _watching(runtime) as reported:
        runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)
        wait_for(lambda: spec.lease_id in reported, timeout_s=30, what="the exit report")

    assert reported[spec.lease_id] == 7


def test_watch_exits_is_silent_about_containers_the_agent_removes(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str
) -> None:
    removed, exits = make_spec(), make_spec(ports=(), command=("sh", "-c", "exit 5"))
    runtime.run(removed, [0], agent_id=agent_id, ready_timeout_s=30)

    with _watching(runtime) as reported:
        runtime.remove(removed.lease_id)
        # Docker orders events: once the later exit is reported, the removal's was seen too.
        runtime.run(exits, [0], agent_id=agent_id, ready_timeout_s=30)
        wait_for(lambda: exits.lease_id in reported, timeout_s=30, what="the exit report")

    assert removed.lease_id not in reported


def test_watch_exits_reports_a_retried_run_after_a_failed_one(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str, docker_client: Any
) -> None:
    # The agent removes the failed run's container itself; the retry's own exit still counts.
    failed = make_spec(ports=(), command=("sleep", "600"), warmup=("sh", "-c", "exit 1"))
    retried = make_spec(
        lease_id=failed.lease_id,
        ports=(),
        command=("sh", "-c", "trap 'exit 3' TERM; sleep 600 & wait"),
    )

    with _watching(runtime) as reported:
        with pytest.raises(ContainerError, match="warm-up"):
            runtime.run(failed, [0], agent_id=agent_id, ready_timeout_s=30)
        result = runtime.run(retried, [0], agent_id=agent_id, ready_timeout_s=30)
        docker_client.containers.get(result.container_id).kill(signal="SIGTERM")
        wait_for(lambda: retried.lease_id in reported, timeout_s=30, what="the exit report")

    assert reported[retried.lease_id] == 3


def test_leases_cannot_reach_each_other_but_the_host_reaches_them(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str, docker_client: Any
) -> None:
    tenant_a, tenant_b = make_spec(), make_spec()
    a = runtime.run(tenant_a, [0], agent_id=agent_id, ready_timeout_s=30)
    b = runtime.run(tenant_b, [1], agent_id=agent_id, ready_timeout_s=30)

    def address(container_id: str) -> str:
        inspect = docker_client.api.inspect_container(container_id)
        assert inspect["HostConfig"]["NetworkMode"] == "cloudgpu"
        assert list(inspect["NetworkSettings"]["Networks"]) == ["cloudgpu"]
        return str(inspect["NetworkSettings"]["Networks"]["cloudgpu"]["IPAddress"])

    def fetch_from_a(ip: str, marker: str) -> int:
        # busybox-static's wget crashes in a scratch image (glibc NSS); nc is the probe. Exit 0
        # only if the page with the marker came back within 2 s.
        probe = f'printf "GET / HTTP/1.0\\r\\n\\r\\n" | nc -w 2 {ip} 8080 | grep -q {marker}'
        code, _ = docker_client.containers.get(a.container_id).exec_run(["sh", "-c", probe])
        return int(code)

    network = docker_client.networks.get("cloudgpu").attrs
    assert network["Driver"] == "bridge"
    assert network["Options"]["com.docker.network.bridge.enable_icc"] == "false"
    assert network["Labels"] == {"cloudgpu.network": "1"}
    # The probe works inside A (on its own address), so a failure below is the network's doing.
    assert fetch_from_a(address(a.container_id), tenant_a.lease_id) == 0
    assert fetch_from_a(address(b.container_id), tenant_b.lease_id) != 0
    page = httpx.get(f"http://127.0.0.1:{b.ports[8080]}/", timeout=5)
    assert page.text.strip() == tenant_b.lease_id


@pytest.fixture
def private_network(monkeypatch: pytest.MonkeyPatch, docker_client: Any) -> Iterator[str]:
    """A network name of this test's own, so that it may create and remove it freely."""
    name = f"cloudgpu-test-{uuid.uuid4().hex[:12]}"
    monkeypatch.setattr(containers, "NETWORK", name)
    yield name
    for network in docker_client.networks.list(names=[name]):
        network.remove()


def _network_ids(docker_client: Any, container_ids: list[str]) -> set[str]:
    return {
        network["NetworkID"]
        for container_id in container_ids
        for network in docker_client.api.inspect_container(container_id)["NetworkSettings"][
            "Networks"
        ].values()
    }


def test_agents_creating_the_network_at_once_share_one(
    docker_client: Any, make_spec: SpecFactory, agent_id: str, private_network: str
) -> None:
    specs = [make_spec() for _ in range(4)]
    barrier = threading.Barrier(len(specs))

    def create(spec: DockerRun) -> str:
        # One runtime each, as separate agents would have.
        runtime = ContainerRuntime(docker_client, gpu_devices="none", allow_local_images=True)
        barrier.wait()
        return runtime.create(spec, [0], agent_id=agent_id)

    with ThreadPoolExecutor(len(specs)) as pool:
        created = list(pool.map(create, specs))

    assert len(_network_ids(docker_client, created)) == 1
    assert len(docker_client.networks.list(names=[private_network])) == 1


def test_containers_share_one_network_when_a_race_made_two(
    runtime: ContainerRuntime,
    make_spec: SpecFactory,
    agent_id: str,
    docker_client: Any,
    private_network: str,
) -> None:
    # What two agents creating it at once can leave behind on Docker before 25 (on later
    # versions the second create is refused and there is just one).
    for _ in range(2):
        with contextlib.suppress(APIError):
            docker_client.api.create_network(
                private_network, driver="bridge", options=containers.NETWORK_OPTIONS
            )

    created = [runtime.create(make_spec(), [0], agent_id=agent_id) for _ in range(2)]

    assert len(_network_ids(docker_client, created)) == 1


def test_a_network_of_that_name_letting_containers_talk_is_refused(
    runtime: ContainerRuntime,
    make_spec: SpecFactory,
    agent_id: str,
    docker_client: Any,
    private_network: str,
) -> None:
    docker_client.networks.create(private_network, driver="bridge")
    spec = make_spec()

    with pytest.raises(ContainerError, match=f"docker network rm {private_network}"):
        runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)

    assert lease_containers(docker_client, spec.lease_id) == []


def test_remove_is_idempotent_and_keeps_the_cache_volume(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str, docker_client: Any
) -> None:
    spec = make_spec()
    runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)

    assert runtime.remove(spec.lease_id) is True
    assert runtime.remove(spec.lease_id) is False

    assert runtime.find(spec.lease_id) is None
    volume = docker_client.volumes.get(f"cloudgpu-cache-{cache_name(agent_id)}")
    assert volume.attrs["Labels"] == {"cloudgpu.cache": cache_name(agent_id)}


@pytest.fixture
def renter_volume(docker_client: Any) -> Iterator[str]:
    """A fresh renter volume's wire name; its Docker volume is removed after the test."""
    name = f"vol-{uuid.uuid4().hex}{uuid.uuid4().hex[:8]}"
    yield name
    remove_volume(docker_client, f"cloudgpu-{name}")


def test_a_renter_volume_keeps_its_files_for_the_next_lease(
    runtime: ContainerRuntime,
    make_spec: SpecFactory,
    agent_id: str,
    docker_client: Any,
    renter_volume: str,
) -> None:
    volumes = (RenterVolume(renter_volume, "/data", 10 * 2**30),)
    marker = uuid.uuid4().hex
    first = make_spec(
        volumes=volumes,
        command=("sh", "-c", f"echo {marker} > /data/kept && " + HTTPD.format(marker="a")),
    )
    runtime.run(first, [0], agent_id=agent_id, ready_timeout_s=30)
    runtime.remove(first.lease_id)
    # The second lease serves what the first left: a missing file would fail its start.
    second = make_spec(
        volumes=volumes,
        command=(
            "sh",
            "-c",
            "mkdir -p /www && cp /data/kept /www/index.html && httpd -f -p 8080 -h /www",
        ),
    )

    result = runtime.run(second, [0], agent_id=agent_id, ready_timeout_s=30)

    assert httpx.get(f"http://127.0.0.1:{result.ports[8080]}/", timeout=10).text.strip() == marker
    volume = docker_client.volumes.get(f"cloudgpu-{renter_volume}")
    assert volume.attrs["Labels"] == {
        "cloudgpu.volume": renter_volume,
        "cloudgpu.volume.size_bytes": str(10 * 2**30),
    }
    mounts = docker_client.api.inspect_container(result.container_id)["Mounts"]
    assert sorted((m["Type"], m["Name"], m["Destination"]) for m in mounts) == [
        ("volume", f"cloudgpu-cache-{cache_name(agent_id)}", "/cache"),
        ("volume", f"cloudgpu-{renter_volume}", "/data"),
    ]


def test_a_volume_of_that_name_not_made_for_a_renter_is_never_mounted(
    runtime: ContainerRuntime,
    make_spec: SpecFactory,
    agent_id: str,
    docker_client: Any,
    renter_volume: str,
) -> None:
    docker_client.volumes.create(f"cloudgpu-{renter_volume}")

    with pytest.raises(ContainerError, match="is not a renter volume"):
        runtime.run(
            make_spec(volumes=(RenterVolume(renter_volume, "/data"),)),
            [0],
            agent_id=agent_id,
            ready_timeout_s=30,
        )


def test_list_claimed_rebuilds_the_view_from_labels(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str
) -> None:
    spec = make_spec()
    result = runtime.run(spec, [2, 5], agent_id=agent_id, ready_timeout_s=30)
    expected = ClaimedContainer(
        lease_id=spec.lease_id,
        container_id=result.container_id,
        agent_id=agent_id,
        status="running",
        gpu_indices=(2, 5),
        ports=result.ports,
    )

    assert runtime.list_claimed(agent_id) == [expected]
    assert expected in runtime.list_claimed()
    assert runtime.list_claimed(str(uuid.uuid4())) == []


def test_exit_info_gives_the_exit_code_and_log_tail(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str
) -> None:
    spec = make_spec(ports=(), command=("sh", "-c", "echo goodbye; exit 5"))
    result = runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)

    code, tail, oom_killed = wait_for(
        lambda: runtime.exit_info(result.container_id), timeout_s=30, what="the exit"
    )

    assert (code, tail.strip(), oom_killed) == (5, "goodbye", False)


def test_unreachable_engine_gives_a_container_error() -> None:
    # A closed TCP port rather than a missing unix socket: docker-py's unix transport leaks its
    # socket when the connect fails, which pytest reports as an unclosed resource.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    client = docker.DockerClient(base_url=f"tcp://127.0.0.1:{free_port}", version="1.41")
    try:
        with pytest.raises(ContainerError, match="Docker engine is not reachable"):
            ContainerRuntime(client, gpu_devices="none", allow_local_images=True).find(
                str(uuid.uuid4())
            )
    finally:
        client.close()


def test_a_cache_volume_shared_between_renters_is_refused(
    runtime: ContainerRuntime, make_spec: SpecFactory, agent_id: str, docker_client: Any
) -> None:
    # The name older hubs sent for every renter of a template.
    spec = make_spec(cache_volume=CacheVolume(name="template-comfyui", path="/root"))

    _refused(runtime, spec, agent_id, "shared between renters")
