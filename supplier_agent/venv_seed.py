"""A new version's virtualenv gets the running agent's own pip, copied, instead of ensurepip.

``python -m venv`` runs ensurepip, which unpacks and byte-compiles pip and, on Python 3.11,
setuptools: about 4 s of CPU on a 2-core host, most of what building an upgrade's side
virtualenv costs, for a pip the running virtualenv already has. The upgrade makes the new one
``--without-pip`` and copies the running pip's installed files into it, as its RECORD lists them
(``importlib.metadata``): the same interpreter makes both, so the same files serve. Installing
wheels needs no setuptools. The console scripts (``bin/pip``) are not copied: they name the old
interpreter, and the upgrade runs ``python -m pip``.

Where the running environment has no complete pip to copy (a file its RECORD lists is gone, or
no pip at all), the new virtualenv is made with ensurepip as before.

``python -m supplier_agent.venv_seed TARGET`` is install.sh's way in, when it re-runs over an
installed agent: the installed virtualenv's interpreter copies its pip into TARGET (made
``--without-pip`` by the same Python); exit 1, saying why, when there is none to copy.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

# Asked of the new virtualenv's interpreter: where its packages go.
PURELIB = "import sysconfig; print(sysconfig.get_path('purelib'))"


@dataclass(frozen=True)
class RunningPip:
    version: str
    files: tuple[tuple[Path, PurePosixPath], ...]  # (installed file, path under site-packages)

    def copy_into(self, purelib: Path) -> None:
        """Copy pip's files under ``purelib`` (the new virtualenv's site-packages); OSError
        (a full disk, say) propagates."""
        for source, relative in self.files:
            destination = purelib / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination)


def running_pip(name: str = "pip") -> RunningPip | None:
    """This interpreter's pip as installed, or None when there is no complete one to copy."""
    try:
        dist = importlib.metadata.distribution(name)
        listed = dist.files
    except (importlib.metadata.PackageNotFoundError, OSError, ValueError):
        return None  # none, or a RECORD that cannot be read
    if listed is None:  # no RECORD: nothing says which files are pip's
        return None
    files = []
    for entry in listed:
        relative = PurePosixPath(entry.as_posix())
        if ".." in relative.parts:  # a script in bin/, outside site-packages
            continue
        source = Path(str(dist.locate_file(entry)))
        if not source.is_file():
            return None
        files.append((source, relative))
    if not any(relative.parts[0] == name for _, relative in files):
        return None
    return RunningPip(dist.version, tuple(files))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m supplier_agent.venv_seed TARGET", file=sys.stderr)
        return 2
    seed = running_pip()
    if seed is None:
        print(f"no complete pip in {sys.prefix} to copy", file=sys.stderr)
        return 1
    python = Path(argv[0]) / "bin" / "python"
    where = subprocess.run(
        [str(python), "-c", PURELIB], capture_output=True, text=True, timeout=60, check=True
    ).stdout.strip()
    seed.copy_into(Path(where))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
