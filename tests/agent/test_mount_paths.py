"""Where a rental's volumes may be mounted (issue 33): one rule for the hub and the agent, and the
agent's parser refuses a docker_run that breaks it, whatever the hub sent."""

from __future__ import annotations

import json

import pytest

from supplier_agent.mount_paths import MOUNT_PATH_RULE, mount_path_refusal
from supplier_agent.protocol import ProtocolError, parse_message

VOL = "vol-" + "a" * 40
CACHE = "renter-" + "b" * 40

REFUSED = [
    ("/data\n--privileged", "control character"),
    ("/data\r", "control character"),
    ("/da\tta", "control character"),
    ("/data\x7f", "control character"),
    ("/data\u202e", "control character"),  # a bidi override, category Cf
    ("/data\u2028x", "control character"),
    ("/data\x00", "control character"),
    ("/\ud800", "lone surrogate"),
    ("/proc", "is /proc, a system folder"),
    ("/proc/self", "inside /proc"),
    ("/sys", "is /sys"),
    ("/sys/fs/cgroup", "inside /sys"),
    ("/etc", "is /etc"),
    ("/etc/ssh", "inside /etc"),
    ("/dev", "is /dev"),
    ("/dev/shm", "inside /dev"),
    ("/usr/lib", "inside /usr"),
    ("/bin", "is /bin"),
    ("/sbin", "is /sbin"),
    ("/lib", "is /lib"),
    ("/lib64/x", "inside /lib64"),
    ("/boot", "is /boot"),
    ("/run", "is /run"),
    ("/var/run/docker.sock", "inside /var/run"),
    ("/var/lock", "is /var/lock"),
    ("/var/lib/docker", "is /var/lib/docker"),
    ("/var/lib/docker/volumes", "inside /var/lib/docker"),
    ("/data/../etc", "normal form"),
    ("/data/..", "normal form"),
    ("/data/", "normal form"),
    ("//data", "normal form"),
    ("/data//x", "normal form"),
    ("/data/./x", "normal form"),
    ("/.", "normal form"),
    ("/", "root folder"),
    ("relative", "not absolute"),
    ("data/x", "not absolute"),
    ("~/data", "not absolute"),
    ("", "empty"),
    ("/" + "a" * 1024, "longer than 1024 bytes"),
    ("/" + "é" * 512, "longer than 1024 bytes"),  # 512 characters, 1025 bytes
]
ALLOWED = [
    "/data",
    "/workspace",
    "/root/.cache/huggingface",
    "/home/user/models",
    "/mnt/x",
    "/opt/app/data",
    "/tmp/scratch",
    "/var/cache/pip",
    "/processed",  # beside /proc, not in it
    "/usr2",
    "/data/my models",
    "/" + "a" * 1023,  # 1024 bytes
]


@pytest.mark.parametrize(("path", "words"), REFUSED)
def test_a_mount_path_outside_the_rule_is_refused_in_words(path: str, words: str) -> None:
    refusal = mount_path_refusal(path)
    assert refusal is not None
    assert words in refusal
    # Every refusal also says what is wanted, with an example.
    assert refusal.endswith(MOUNT_PATH_RULE)
    assert "e.g. /data" in refusal


@pytest.mark.parametrize("path", ALLOWED)
def test_ordinary_folders_are_mount_paths(path: str) -> None:
    assert mount_path_refusal(path) is None


@pytest.mark.parametrize("value", [None, 1, b"/data", ["/data"]])
def test_a_mount_path_is_a_string(value: object) -> None:
    assert mount_path_refusal(value) == f"is not a string; {MOUNT_PATH_RULE}"


def _run(**fields: object) -> str:
    return json.dumps(
        {
            "type": "docker_run",
            "v": 1,
            "command_id": "b40eb379-f306-4918-85d5-ef84e2c61a7d",
            "lease_id": "2b0431d7-75db-4672-bf40-937b104cdb5e",
            "epoch": 1,
            "image": "busybox:latest",
            **fields,
        }
    )


# The protocol's own checks of a string (NUL, lone surrogates, length) answer before the rule.
_PARSER_WORDS = {"/data\x00": "NUL", "/\ud800": "lone surrogate", "/" + "a" * 1024: "longer"}


@pytest.mark.parametrize(("path", "words"), REFUSED)
def test_the_agent_refuses_a_renter_volume_at_such_a_path(path: str, words: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_message(_run(volumes=[{"name": VOL, "path": path}]))
    assert "docker_run.volumes[0].path" in str(caught.value)
    assert _PARSER_WORDS.get(path, words) in str(caught.value)


@pytest.mark.parametrize(("path", "words"), REFUSED)
def test_the_agent_refuses_a_cache_volume_at_such_a_path(path: str, words: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_message(_run(cache_volume={"name": CACHE, "path": path}))
    assert "cache_volume.path" in str(caught.value)
    assert _PARSER_WORDS.get(path, words) in str(caught.value)


@pytest.mark.parametrize("path", ALLOWED)
def test_the_agent_takes_volumes_at_ordinary_folders(path: str) -> None:
    message = parse_message(
        _run(
            volumes=[{"name": VOL, "path": path}],
            cache_volume={"name": CACHE, "path": "/root/.cache"},
        )
    )
    assert message.volumes[0].path == path  # type: ignore[attr-defined]
