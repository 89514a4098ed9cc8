"""The front door's promises that a newcomer acts on before anything else runs: the commands it
gives work with the packages of the machine it describes, and every path it names is in the
repository they cloned."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _shell_lines(markdown: str) -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", markdown, flags=re.DOTALL)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]


def test_the_compose_command_is_the_one_debians_packages_provide_and_ci_runs() -> None:
    """Debian's docker.io comes with docker-compose 1.29 and no Compose v2 plugin, so
    `docker compose up` fails there (issue 34 item 8): the block must give `docker-compose`,
    the program tests/e2e/test_compose.py runs the same file with."""
    section = _section((REPO_ROOT / "README.md").read_text(), "Deploying with Docker Compose")
    commands = _shell_lines(section)
    assert "docker-compose up -d --build" in commands, commands
    assert 'shutil.which("docker-compose")' in (REPO_ROOT / "tests/e2e/test_compose.py").read_text()
    # Both spellings are named in the prose, so a reader with Compose v2 is not lost either.
    assert "`docker compose up -d --build`" in section


def test_no_document_points_outside_the_repository() -> None:
    """A clone holds only the repository: a relative link or path (`../shared/seeds/` was
    one) must resolve, from its document's folder, to a file of the repository."""
    outside = []
    for path in DOCS:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            targets = re.findall(r"\]\((\.\.?/[^)#\s]*)", line)
            targets += re.findall(r"`(\.\./[^`\s]*)`", line)
            for target in targets:
                resolved = (path.parent / target).resolve()
                if not resolved.is_relative_to(REPO_ROOT) or not resolved.exists():
                    outside.append(f"{path.relative_to(REPO_ROOT)}:{number}: {target}")
    assert outside == []


def test_every_repository_path_in_the_readme_exists() -> None:
    """Paths the README names in backticks (docs/…, tests/…, hub/…) are there to open."""
    text = (REPO_ROOT / "README.md").read_text()
    roots = ("docs/", "tests/", "hub/", "supplier_agent/", "bench/", "deploy/", ".ci/")
    named = {
        match.rstrip(".,:;")
        for match in re.findall(r"`([A-Za-z0-9_./-]+)`", text)
        if match.startswith(roots) and "<" not in match and "*" not in match
    }
    missing = sorted(path for path in named if not (REPO_ROOT / path).exists())
    assert missing == []
