"""docs/observability: the alert rules pass promtool, and every series the dashboard and the
rules query is one the hub or the agent exports (a renamed metric breaks this, not an alert)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from hub.fleet.metrics import FleetCollector
from supplier_agent import metrics as agent_metrics
from supplier_agent.gpu import Nvml
from supplier_agent.gpu_health import HealthWatch
from tests.support.fake_gpus import FakeGpuTable, installed_fake_nvml
from tests.support.processes import REPO_ROOT

DOCS = REPO_ROOT / "docs" / "observability"
SERIES = re.compile(r"\b(cloudgpu_[a-z_]+|DCGM_FI_[A-Z_]+)\b")
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count", "_created")


def _names(families: Iterable[object]) -> set[str]:
    return {f"{family.name}{suffix}" for family in families for suffix in SUFFIXES}  # type: ignore[attr-defined]


def _queried() -> set[str]:
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    rules = (DOCS / "alerts.yml").read_text()
    return set(SERIES.findall("\n".join(exprs))) | set(SERIES.findall(rules))


def test_promtool_accepts_the_alert_rules() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus; .ci/run installs it)")
    result = subprocess.run(
        [promtool, "check", "rules", str(DOCS / "alerts.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.django_db
def test_the_dashboard_and_rules_query_only_exported_series(tmp_path: Path) -> None:
    exported = _names(REGISTRY.collect()) | _names(FleetCollector().collect())
    table = FakeGpuTable.create(tmp_path / "gpus.json")
    with installed_fake_nvml(table.path):
        nvml = Nvml()
        watch = HealthWatch(nvml)
        watch.watch(nvml.gpus())
        view = agent_metrics.AgentView(lambda: True, lambda: 0, lambda: 0)
        exported |= _names(agent_metrics.AgentCollector(view, nvml, watch).collect())
        nvml.shutdown()
    queried = _queried()
    assert len(queried) > 20
    assert queried - exported == set()
