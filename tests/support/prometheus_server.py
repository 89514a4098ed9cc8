"""A real Prometheus server (Debian's ``prometheus``) for end-to-end tests: on loopback, with a
generated configuration that scrapes given targets every second and loads the alert rules of
docs/observability, its data in the test's folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from hub.lib.ports import free_port, wait_for_port
from tests.support.polling import wait_for
from tests.support.processes import REPO_ROOT

RULES = REPO_ROOT / "docs" / "observability" / "alerts.yml"


@dataclass(frozen=True)
class Job:
    name: str
    target: str  # host:port
    bearer_token: str | None = None


@dataclass
class Prometheus:
    url: str

    def query(self, expr: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        response.raise_for_status()
        body = response.json()
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def value(self, expr: str) -> float | None:
        """The query's single value, or None while it has no result."""
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def wait_for_value(self, expr: str, expected: float, timeout_s: float = 60) -> None:
        wait_for(
            lambda: self.value(expr) == expected,
            timeout_s=timeout_s,
            interval_s=0.5,
            what=f"{expr} == {expected} (last: {self.value(expr)})",
        )


def _config(jobs: list[Job], folder: Path) -> dict[str, Any]:
    scrape_configs = []
    for job in jobs:
        config: dict[str, Any] = {
            "job_name": job.name,
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "static_configs": [{"targets": [job.target]}],
        }
        if job.bearer_token is not None:
            token_file = folder / f"{job.name}.token"
            token_file.write_text(job.bearer_token)
            config["authorization"] = {"type": "Bearer", "credentials_file": str(token_file)}
        scrape_configs.append(config)
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": scrape_configs,
    }


@contextmanager
def prometheus_server(folder: Path, jobs: list[Job]) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("CLOUDGPU_REQUIRE_PROMETHEUS") == "1":
            pytest.fail("the prometheus server is not installed (Debian package prometheus)")
        pytest.skip("the prometheus server is not installed (Debian package prometheus)")
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "prometheus.yml"
    # JSON is YAML: no YAML library needed to write it.
    config.write_text(json.dumps(_config(jobs, folder)))
    port = free_port()
    log = open(folder / "prometheus.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        assert wait_for_port(port, timeout_s=60), (folder / "prometheus.log").read_text()
        yield Prometheus(f"http://127.0.0.1:{port}")
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
