"""Files the CLI writes in your home (its config, known_hosts, ssh config): atomically and
readable only by you, and blocks of its own marked so a rewrite replaces them in place."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """A temp file made 0600 from the start in the same folder, then renamed: neither a crash
    nor another reader ever sees it half-written or world-readable."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def replace_marked_block(text: str, mark: str, body: str, *, at_top: bool = False) -> str:
    """``text`` with the block between ``# >>> mark >>>`` and ``# <<< mark <<<`` replaced by
    ``body``, or the block added (at the end, or the top) when there is none yet."""
    begin, end = f"# >>> {mark} >>>", f"# <<< {mark} <<<"
    block = f"{begin}\n{body.rstrip(chr(10))}\n{end}\n"
    lines = text.splitlines(keepends=True)
    starts = [n for n, line in enumerate(lines) if line.rstrip("\n") == begin]
    if starts:
        first = starts[0]
        last = next(
            (n for n in range(first, len(lines)) if lines[n].rstrip("\n") == end), len(lines) - 1
        )
        return "".join(lines[:first]) + block + "".join(lines[last + 1 :])
    if at_top:
        return block + ("\n" + text if text else "")
    if text and not text.endswith("\n"):
        text += "\n"
    return text + ("\n" if text else "") + block
