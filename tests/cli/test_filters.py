"""The offers filter syntax: every field and operator, and what a bad filter says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cloudgpu_cli import filters
from cloudgpu_cli.errors import USAGE, CliError

CLOUDGPU = str(Path(sys.executable).with_name("cloudgpu"))


@pytest.mark.parametrize(
    ("term", "param", "value"),
    [
        ("gpu=4090", "model", "4090"),
        ("model=A100", "model", "A100"),
        ("gpu==H100", "model", "H100"),
        ("location=US", "location", "US"),
        ("location=US West", "location", "US West"),
        ("vram>=24", "min_vram_gib", "24"),
        ("price<=1.5", "max_price", "1.5"),
        ("price<=2", "max_price", "2"),
        ("num_gpus>=2", "num_gpus", "2"),
        ("num_gpus=4", "num_gpus", "4"),
        ("cpus>=16", "min_cpus", "16"),
        ("ram>=64", "min_ram_gib", "64"),
        ("disk>=100", "min_disk_gib", "100"),
        ("cuda>=12.4", "min_cuda", "12.4"),
        ("cuda>=12", "min_cuda", "12"),
        ("rtt<=50", "max_rtt_ms", "50"),
        ("uptime>=99", "min_uptime_pct", "99"),
        ("VRAM >= 24", "min_vram_gib", "24"),
    ],
)
def test_each_field_maps_to_its_query_param(term: str, param: str, value: str) -> None:
    assert filters.to_params([term]) == {param: value}


def test_filters_combine() -> None:
    terms = ["gpu=4090", "vram>=24", "price<=1.5", "num_gpus>=2", "uptime>=99"]
    assert filters.to_params(terms) == {
        "model": "4090",
        "min_vram_gib": "24",
        "max_price": "1.5",
        "num_gpus": "2",
        "min_uptime_pct": "99",
    }


@pytest.mark.parametrize(
    ("term", "message"),
    [
        ("colour=red", "bad filter: unknown field 'colour'"),
        ("vram<=24", "bad filter: vram takes >=, not <="),
        ("price>=1", "bad filter: price takes <=, not >="),
        ("gpu>=4090", "bad filter: gpu takes =, not >="),
        ("location<=US", "bad filter: location takes =, not <="),
        ("cpus<=4", "bad filter: cpus takes >=, not <="),
        ("ram<=4", "bad filter: ram takes >=, not <="),
        ("disk<=4", "bad filter: disk takes >=, not <="),
        ("cuda<=12", "bad filter: cuda takes >=, not <="),
        ("rtt>=5", "bad filter: rtt takes <=, not >="),
        ("uptime<=5", "bad filter: uptime takes >=, not <="),
        ("num_gpus<=2", "bad filter: num_gpus takes >= or =, not <="),
        ("vram>=lots", "bad filter: vram needs a whole number, not 'lots'"),
        ("vram>=1.5", "bad filter: vram needs a whole number, not '1.5'"),
        ("price<=cheap", "bad filter: price needs a number, not 'cheap'"),
        ("price<=-1", "bad filter: price needs a number, not '-1'"),
        ("cuda>=twelve", "bad filter: cuda needs a version like 12.4, not 'twelve'"),
        ("vram>=", "bad filter: 'vram>=' has no value"),
        ("vram", "bad filter: 'vram' is not FIELD OP VALUE (e.g. vram>=24)"),
        ("vram>24", "bad filter: 'vram>24' is not FIELD OP VALUE (e.g. vram>=24)"),
    ],
)
def test_a_bad_filter_is_one_clear_message(term: str, message: str) -> None:
    with pytest.raises(CliError) as caught:
        filters.to_params([term])
    assert caught.value.message.startswith(message)
    assert caught.value.code == USAGE


def test_a_contradiction_is_refused() -> None:
    with pytest.raises(CliError, match="contradicts"):
        filters.to_params(["vram>=24", "vram>=48"])


def test_the_command_exits_2_with_one_line(tmp_path: Path) -> None:
    # Parsed before any request: no hub or token is needed to be told the filter is wrong.
    result = subprocess.run(
        [CLOUDGPU, "offers", "vram>=24", "colour=red"],
        capture_output=True,
        text=True,
        env={"XDG_CONFIG_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("cloudgpu: bad filter: unknown field 'colour'")
    assert result.stderr.count("\n") == 1
