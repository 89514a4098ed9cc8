"""A real process that claims GPUs the way an agent does, for tests of claims across processes.

Child side (``python -m tests.support.claim_race LOCK_DIR LEASE_ID AGENT_ID``, with the fake
NVML environment): prints a JSON ``ready`` line, waits for ``go`` on stdin so that several
children can be released at the same moment, reserves, prints the JSON outcome, then holds the
claim until stdin says anything or closes, and releases.

Parent side: ``ClaimProcess`` starts one and talks to it with deadlines, never fixed sleeps.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.fake_gpus import fake_nvml_env
from tests.support.processes import REPO_ROOT


def _say(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("lock_dir", type=Path)
    parser.add_argument("lease_id")
    parser.add_argument("agent_id")
    parser.add_argument("--gpus", default="0")
    parser.add_argument("--compute-mode", default="best-effort")
    args = parser.parse_args(argv)

    import pynvml  # reported so that the test can tell the fake was the one imported

    from supplier_agent.claims import ClaimManager, ClaimRefused
    from supplier_agent.gpu import Nvml

    nvml = Nvml()
    owner = {"agent_id": args.agent_id, "pid": os.getpid()}
    manager = ClaimManager(args.lock_dir, nvml, args.compute_mode, owner)
    # Initialise NVML before the start line so that every racer is equally ready to go.
    _say({"ready": nvml.available, "pid": os.getpid(), "pynvml": pynvml.__file__})
    if sys.stdin.readline().strip() != "go":
        return 1
    indices = [int(i) for i in args.gpus.split(",")]
    try:
        result = manager.reserve(args.lease_id, indices)
    except ClaimRefused as exc:
        _say({"ok": False, "reason": exc.reason})
    else:
        won = {"ok": True, "lease_id": args.lease_id, "agent_id": args.agent_id}
        _say({**won, "pid": os.getpid(), "warnings": list(result.warnings)})
    sys.stdin.readline()  # hold the claim until the test has seen every racer's outcome
    manager.release(args.lease_id)
    nvml.shutdown()
    return 0


class ClaimProcess:
    """One child started with the fake NVML reading ``table_path``."""

    def __init__(
        self,
        table_path: Path,
        lock_dir: Path,
        lease_id: str,
        agent_id: str,
        log: Path,
        *extra: str,
    ) -> None:
        self.log = log
        self._log_file = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self._buffer = b""
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.claim_race",
                str(lock_dir),
                lease_id,
                agent_id,
                *extra,
            ],
            cwd=REPO_ROOT,
            env={**os.environ, **fake_nvml_env(table_path)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            bufsize=0,
        )

    def read(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """The child's next JSON line; fails the test at the deadline or if the child died."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no answer from the claim process; log: {self._tail()}")
            ready, _, _ = select.select([self.process.stdout], [], [], remaining)
            if ready:
                chunk = os.read(self.process.stdout.fileno(), 4096)
                if not chunk:
                    raise AssertionError(f"the claim process exited; log: {self._tail()}")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        self.process.stdin.flush()

    def _tail(self) -> str:
        self._log_file.flush()
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self, timeout_s: float = 30.0) -> int:
        """Let the child release and exit (closing stdin), or kill it at the deadline."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(BrokenPipeError):  # the child may be dead already
                self.process.stdin.close()
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log_file.close()
        return code


if __name__ == "__main__":
    sys.exit(main())
