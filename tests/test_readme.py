"""The front door's promises that a newcomer acts on before anything else runs: the commands it
gives work with the packages of the machine it describes, every path it names is in the
repository they cloned, and every link between the documents lands on a heading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"
DOCS = [README, *sorted((REPO_ROOT / "docs").rglob("*.md"))]
README_MAX_LINES = 300


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _shell_lines(markdown: str) -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", markdown, flags=re.DOTALL)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]


def _prose(markdown: str) -> str:
    """The text outside fenced blocks, where links and headings live."""
    return re.sub(r"^```.*?^```", "", markdown, flags=re.DOTALL | re.MULTILINE)


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", _prose(path.read_text()), flags=re.MULTILINE):
        anchor = _anchor(heading)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        anchors.add(anchor if count == 0 else f"{anchor}-{count}")
    return anchors


def test_the_readme_is_a_front_door() -> None:
    """The README is what a newcomer reads first: the title, then the two commands, and no
    more than a screen or two before it sends each reader to their document (issue 35)."""
    text = README.read_text()
    assert text.startswith("# CloudGPU\n\n```sh\nmake run ")
    assert "\nmake test " in text.split("```")[1]
    assert len(text.splitlines()) <= README_MAX_LINES
    documentation = _section(text, "Documentation")
    for doc in sorted((REPO_ROOT / "docs").glob("*.md")):
        assert f"](docs/{doc.name})" in documentation, doc.name


def test_the_compose_command_is_the_one_debians_packages_provide_and_ci_runs() -> None:
    """Debian's docker.io comes with docker-compose 1.29 and no Compose v2 plugin, so
    `docker compose up` fails there (issue 34 item 8): the block must give `docker-compose`,
    the program tests/e2e/test_compose.py runs the same file with."""
    operators = (REPO_ROOT / "docs/operators.md").read_text()
    section = _section(operators, "Deploying with Docker Compose")
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


def test_every_link_between_the_documents_lands() -> None:
    """Sections moved from the README into docs/ (issue 35): a link to a file of the
    repository finds it, and one to a heading (`operators.md#observability`, `#volumes`) finds
    that heading in that document."""
    broken = []
    for path in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(path.read_text())):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                broken.append(f"{path.relative_to(REPO_ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{path.relative_to(REPO_ROOT)}: {target} (no such heading)")
    assert broken == []


def test_every_repository_path_in_the_documents_exists() -> None:
    """Paths the README and docs/ name in backticks (docs/…, tests/…, hub/…) are there to
    open."""
    roots = ("docs/", "tests/", "hub/", "supplier_agent/", "bench/", "deploy/", ".ci/")
    missing = []
    for path in DOCS:
        named = {
            match.rstrip(".,:;")
            for match in re.findall(r"`([A-Za-z0-9_./-]+)`", path.read_text())
            if match.startswith(roots) and "<" not in match and "*" not in match
        }
        missing += [
            f"{path.relative_to(REPO_ROOT)}: {name}"
            for name in sorted(named)
            if not (REPO_ROOT / name).exists() and not _names_a_module_attribute(name)
        ]
    assert missing == []


def _names_a_module_attribute(name: str) -> bool:
    """`hub/lib/redis_pipeline.send`: the function `send` of `hub/lib/redis_pipeline.py`."""
    module, _, attribute = name.rpartition(".")
    return bool(module) and attribute.isidentifier() and (REPO_ROOT / f"{module}.py").is_file()


def test_the_readmes_screenshot_is_in_the_repository_and_small() -> None:
    """The front door shows the product (issue 35): an image of the repository, small enough
    that a clone and the package page stay light."""
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", README.read_text())
    assert images
    for image in images:
        assert (REPO_ROOT / image).is_file(), image
        assert (REPO_ROOT / image).stat().st_size < 300 * 1024, image
