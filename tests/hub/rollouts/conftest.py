"""The release every rollout test's hub serves (as AGENT_RELEASE_DIR would), and timings."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.test import override_settings

from hub.lib import channel_send

TARGET = "0.4.0"


@pytest.fixture(autouse=True)
def served_release(tmp_path: Path) -> Iterator[None]:
    """The hub serves TARGET from a release folder (as AGENT_RELEASE_DIR)."""
    (tmp_path / "cloudgpu_agent-0.4.0-py3-none-any.whl").write_bytes(b"wheel")
    (tmp_path / "release.json").write_text(
        json.dumps(
            {
                "version": TARGET,
                "filename": "cloudgpu_agent-0.4.0-py3-none-any.whl",
                "sha256": "0" * 64,
            }
        )
    )
    with override_settings(
        AGENT_RELEASE_DIR=str(tmp_path),
        ROLLOUT_OBSERVE_S=60,
        ROLLOUT_HOST_TIMEOUT_S=300,
        ROLLOUT_MAX_FAILURE_PERCENT=10,
        ROLLOUT_FRESH_RENTAL_S=600,
    ):
        yield
    channel_send.close()
