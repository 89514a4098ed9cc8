"""supplier_agent/venv_seed.py: an upgrade's new virtualenv gets the running pip, copied."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from supplier_agent import venv_seed


def _fake_dist(site: Path, name: str, record: list[str], present: list[str]) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "RECORD").write_text("".join(f"{path},,\n" for path in record))
    for path in present:
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text("# installed\n")


def test_the_copied_pip_runs_in_a_virtualenv_made_without_one(tmp_path: Path) -> None:
    seed = venv_seed.running_pip()
    assert seed is not None, "the test interpreter has pip"
    target = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    python = str(target / "bin" / "python")
    where = subprocess.run(
        [python, "-c", venv_seed.PURELIB], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert not (Path(where) / "pip").exists()

    seed.copy_into(Path(where))

    shown = subprocess.run(
        [python, "-m", "pip", "--version"], capture_output=True, text=True, check=True
    ).stdout
    # Its own copy, at the running one's version; nothing of the old environment's path.
    assert shown.startswith(f"pip {seed.version} from {where}/pip "), shown
    assert not (target / "bin" / "pip").exists()  # scripts name the old interpreter


def test_no_pip_or_an_incomplete_one_is_not_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    _fake_dist(
        site, "brokenpip", ["brokenpip/__init__.py", "brokenpip/gone.py"], ["brokenpip/__init__.py"]
    )
    _fake_dist(
        site,
        "wholepip",
        ["wholepip/__init__.py", "wholepip-1.0.dist-info/RECORD", "../../../bin/wholepip"],
        ["wholepip/__init__.py"],
    )
    monkeypatch.syspath_prepend(str(site))

    assert venv_seed.running_pip("no-such-distribution") is None
    assert venv_seed.running_pip("brokenpip") is None  # a file its RECORD lists is gone
    whole = venv_seed.running_pip("wholepip")
    assert whole is not None
    # The script outside site-packages is left out; the rest is copied.
    assert [str(relative) for _, relative in whole.files] == [
        "wholepip/__init__.py",
        "wholepip-1.0.dist-info/RECORD",
    ]
    whole.copy_into(tmp_path / "new-site")
    assert (tmp_path / "new-site" / "wholepip" / "__init__.py").read_text() == "# installed\n"


def test_the_command_copies_this_interpreters_pip_into_a_target(tmp_path: Path) -> None:
    """install.sh's way in: ``python -m supplier_agent.venv_seed TARGET``."""
    target = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    seed = [sys.executable, "-m", "supplier_agent.venv_seed"]
    assert subprocess.run(seed, capture_output=True, check=False).returncode == 2

    subprocess.run([*seed, str(target)], check=True)

    shown = subprocess.run(
        [str(target / "bin" / "python"), "-m", "pip", "--version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert shown.startswith(f"pip {venv_seed.running_pip().version} from {target}"), shown
