"""The commands the README and docs/ give run as written (issue 35): every ```sh block's
`make` target is in the Makefile, every `python -m MODULE` and `.venv/bin/PROGRAM` is there,
every `cloudgpu-agent`, `python -m hub.runner` and `manage.py hub` subcommand exists (its
`--help` answers), and repository files a command names exist. Blocks marked
`<!-- runs-in-tests -->` are cheap and safe (help texts, `make -n`) and are run as they are."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
RUNS_IN_TESTS = "<!-- runs-in-tests -->"
# A ```sh block, and the marker right before it (a blank line between them allowed).
BLOCK = re.compile(
    rf"^(?P<marker>{RUNS_IN_TESTS}\n\n?)?```sh\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL
)
SEPARATORS = {"|", "||", "&&", ";", "&"}
PYTHONS = {"python", "python3", ".venv/bin/python"}
VENV_BIN = Path(sys.executable).parent


def _blocks() -> Iterator[tuple[str, bool, str]]:
    """(where, marked, body) for every ```sh block of the README and docs/*.md."""
    for path in DOCS:
        text = path.read_text()
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start("body")) + 1
            where = f"{path.relative_to(REPO_ROOT)}:{line}"
            yield where, match.group("marker") is not None, match.group("body")


def _commands(body: str) -> Iterator[list[str]]:
    """Each simple command of a block: continuation lines joined, comments and the
    separators of a pipeline or list dropped, `$(...)` substitutions as commands of their own."""
    for line in body.replace("\\\n", " ").splitlines():
        for inner in re.findall(r"\$\(([^()]*)\)", line):
            yield from _commands(inner)
        lexer = shlex.shlex(
            re.sub(r"\$\([^()]*\)", "SUBSTITUTED", line), posix=True, punctuation_chars=";&|"
        )
        lexer.whitespace_split = True
        lexer.commenters = "#"
        command: list[str] = []
        for token in lexer:
            if token in SEPARATORS:
                if command:
                    yield command
                command = []
            else:
                command.append(token)
        if command:
            yield command


def _program(command: list[str]) -> list[str]:
    """The command without its leading variable assignments, `sudo` and `export`."""
    while command and (re.match(r"^[A-Z_][A-Z0-9_]*=", command[0]) or command[0] in ("sudo",)):
        command = command[1:]
    return command


def _make_targets() -> set[str]:
    makefile = (REPO_ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9_.-]+):(?!=)", makefile, flags=re.M))


def _repository_paths(command: list[str]) -> list[str]:
    """Arguments that name a file of the repository (`.env.example`, `.ci/compose/...`): a
    relative path whose first part is at the repository's top."""
    top = {entry.name for entry in REPO_ROOT.iterdir()}
    return [
        argument
        for argument in command
        if re.fullmatch(r"[\w.-]+(/[\w.-]+)*/?", argument)
        and ("/" in argument or "." in argument)
        and argument.split("/")[0] in top
        and argument not in (".", "..")
    ]


def _help_of(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        [*argv, "--help"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def _subcommand_chain(parser: object, argv: list[str]) -> list[str]:
    """The leading words of argv that name subcommands of an argparse parser, refusing one
    that names none."""
    import argparse

    chain = []
    for word in argv:
        subparsers = [
            action
            for action in getattr(parser, "_actions", [])
            if isinstance(action, argparse._SubParsersAction)
        ]
        if not subparsers:
            break
        choices = subparsers[0].choices
        assert word in choices, f"no subcommand {' '.join([*chain, word])!r}: {sorted(choices)}"
        chain.append(word)
        parser = choices[word]
    return chain


def _check_manage_hub(argv: list[str]) -> None:
    """`manage.py hub ...` as written parses: its subcommands and options exist, and the
    subcommand's `--help` answers. In-process (Django is set up; no database is touched)."""
    from django.core.management import CommandError

    from hub.leases.management.commands.hub import Command

    parser = Command().create_parser("manage.py", "hub")
    chain = _subcommand_chain(parser, argv)
    with contextlib.redirect_stdout(io.StringIO()) as out, pytest.raises(SystemExit) as exited:
        parser.parse_args([*chain, "--help"])
    assert exited.value.code == 0, out.getvalue()
    try:
        parser.parse_args(argv)
    except CommandError as exc:  # Django's parser, when not called from a command line
        pytest.fail(f"manage.py hub {shlex.join(argv)}: {exc}")


def _check(command: list[str], make_targets: set[str]) -> list[str]:
    """What is wrong with one command (nothing when it can run as written)."""
    problems = []
    argv = _program(command)
    if argv and argv[0] == "export":
        argv = []
    for path in _repository_paths(argv):
        if not (REPO_ROOT / path).exists():
            problems.append(f"{path}: not in the repository")
    if not argv:
        return problems
    program, args = argv[0], argv[1:]
    if program == "make":
        targets = [arg for arg in args if not arg.startswith("-") and "=" not in arg]
        problems += [f"make {t}: no such target" for t in targets if t not in make_targets]
    elif program.startswith(".venv/bin/") and not (
        (REPO_ROOT / program).exists() or (VENV_BIN / Path(program).name).exists()
    ):
        problems.append(f"{program}: not in the virtualenv")
    if program in PYTHONS and args[:1] == ["-m"] and len(args) > 1:
        module = args[1]
        if importlib.util.find_spec(module) is None:
            problems.append(f"python -m {module}: no such module")
        elif module == "hub.runner":
            chain = [arg for arg in args[2:3] if not arg.startswith("-")]
            result = _help_of([sys.executable, "-m", module, *chain])
            if result.returncode != 0:
                problems.append(f"python -m hub.runner {shlex.join(chain)}: {result.stderr}")
    elif program in PYTHONS and args[:2] == ["manage.py", "hub"]:
        _check_manage_hub(args[2:])
    elif program in PYTHONS and args[:1] == ["manage.py"]:
        if not list(REPO_ROOT.glob(f"hub/*/management/commands/{args[1]}.py")):
            problems.append(f"manage.py {args[1]}: not a command of the hub")
    elif program == "cloudgpu-agent":
        chain = [arg for arg in args[:1] if not arg.startswith("-")]
        result = _help_of(["cloudgpu-agent", *chain])
        if result.returncode != 0:
            problems.append(f"cloudgpu-agent {shlex.join(chain)} --help: {result.stderr}")
    return problems


def test_the_documents_have_commands_and_runnable_blocks() -> None:
    """The checks below look at something: the two commands, and a few blocks marked to run."""
    blocks = list(_blocks())
    assert blocks[0][0] == "README.md:4", blocks[0]
    assert ["make", "run"] in list(_commands(blocks[0][2]))
    assert sum(marked for _where, marked, _body in blocks) >= 3


def test_every_command_in_the_documents_can_run_as_written() -> None:
    make_targets = _make_targets()
    problems = []
    for where, _marked, body in _blocks():
        for command in _commands(body):
            problems += [f"{where}: {problem}" for problem in _check(command, make_targets)]
    assert problems == []


def test_the_blocks_marked_to_run_in_tests_succeed() -> None:
    """Each block marked `<!-- runs-in-tests -->` runs as a reader would paste it (with the
    virtualenv's programs on PATH, as after `make run` set it up), and exits 0."""
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    failed = []
    for where, marked, body in _blocks():
        if not marked:
            continue
        if not (REPO_ROOT / ".venv/bin").is_dir():  # a virtualenv elsewhere (make VENV=...)
            body = body.replace(".venv/bin/", f"{VENV_BIN}/")
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", body],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if result.returncode != 0:
            failed.append(f"{where}: exit {result.returncode}: {result.stderr[-2000:]}")
    assert failed == []


def test_the_checks_catch_a_wrong_command() -> None:
    """The checker refuses what a stale document would say."""
    targets = _make_targets()
    assert _check(["make", "no-such-target"], targets) == ["make no-such-target: no such target"]
    assert _check(["python", "-m", "hub.no_such_module"], targets)
    assert _check([".venv/bin/no-such-program"], targets)
    assert _check(["cp", ".ci/no-such-file", ".env"], targets)
    assert _check(["cloudgpu-agent", "no-such-command"], targets)
    assert _check(["python", "-m", "hub.runner", "no-such-command"], targets)
    with pytest.raises(AssertionError, match="no subcommand"):
        _check(["python", "manage.py", "hub", "lease", "no-such-verb"], targets)
    with pytest.raises(pytest.fail.Exception, match="--no-such-option"):
        _check(["python", "manage.py", "hub", "hosts", "--no-such-option"], targets)
    assert list(_commands("A=1 make -n test | tail -1 # a comment\n")) == [
        ["A=1", "make", "-n", "test"],
        ["tail", "-1"],
    ]
