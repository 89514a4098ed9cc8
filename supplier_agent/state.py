"""What the agent keeps on disk between runs (its state folder): its id, the claims it holds,
the highest epoch seen per GPU, and the answers to commands it has already executed.

A command seen before (same ``command_id``), even across a restart, gets the stored answer and
no second effect; a command with an older epoch than one already seen for its GPU is refused.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Answers kept, in memory and (compacted at twice this) in commands.jsonl. In memory each is
# its journal line, not a dict: 10,000 dicts took ~10 MB of a 40 MB agent (issue 23).
MAX_REMEMBERED_COMMANDS = 10_000


def _write_atomic(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _read_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default
    except (OSError, ValueError):
        # A torn or corrupt file must not keep the agent from starting; start that part afresh.
        return default


def load_agent_id(state_dir: Path) -> str:
    """The agent's id, made once and kept; safe to call while an agent runs (smoke does)."""
    path = state_dir / "agent_id"
    try:
        return str(uuid.UUID(path.read_text().strip()))
    except (FileNotFoundError, ValueError):
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        agent_id = str(uuid.uuid4())
        path.write_text(agent_id + "\n")
        return agent_id


class StateInUse(Exception):
    """Another agent process already runs on this state folder."""


def lock_state_dir(state_dir: Path) -> int:
    """Hold an exclusive lock on the state folder for the life of the agent process: two agents
    on one folder would interleave the command journal."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(state_dir / "agent.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise StateInUse(f"another agent (pid {holder}) is running on {state_dir}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def lock_holder(state_dir: Path) -> str | None:
    """The pid (as its lock file says) of the agent running on ``state_dir``, or None when none
    is. For ``upgrade --no-systemd``, which must say whether an agent still runs the old version.
    The shared lock taken to find out is held for an instant; an agent starting in exactly that
    instant would be refused (StateInUse), so this is only for answers a person reads."""
    try:
        fd = os.open(state_dir / "agent.lock", os.O_RDONLY)
    except OSError:
        return None  # no lock file: no agent ever ran here (or we may not read it: say nothing)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        return None  # closing the descriptor below drops our shared lock
    finally:
        os.close(fd)


class ReadOnlyState(RuntimeError):
    """A write to a state folder opened read-only (``run --trial``): a bug, never a user error."""


@dataclass
class Claim:
    lease_id: str
    gpu_indices: list[int]
    epoch: int
    container_id: str | None = None
    ports: dict[str, int] = field(default_factory=dict)
    paid_until: str | None = None
    # The docker_run's TunnelSpec as plain JSON, so a restarted agent reopens the tunnel.
    tunnel: dict[str, Any] | None = None


class AgentState:
    def __init__(self, state_dir: Path, *, read_only: bool = False) -> None:
        """``read_only``: for ``run --trial``, which reads the state while the agent may be
        running on it (as ``smoke`` does): no journal compaction, and any write raises."""
        self.dir = state_dir
        self.read_only = read_only
        if not read_only:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.agent_id = self._load_agent_id()
        self.claims: dict[str, Claim] = {
            lease_id: Claim(**value)
            for lease_id, value in _read_json(self.dir / "claims.json", {}).items()
        }
        self.epochs: dict[int, int] = {
            int(k): int(v) for k, v in _read_json(self.dir / "epochs.json", {}).items()
        }
        self.answers: OrderedDict[str, str] = self._load_answers()
        self._journaled = len(self.answers)  # lines in commands.jsonl

    def _load_agent_id(self) -> str:
        return load_agent_id(self.dir)

    def _load_answers(self) -> OrderedDict[str, str]:
        answers: OrderedDict[str, str] = OrderedDict()
        path = self.dir / "commands.jsonl"
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return answers
        for line in lines:
            try:
                entry = json.loads(line)
                answers[entry["command_id"]] = json.dumps(entry["ack"])
            except (ValueError, KeyError, TypeError):
                continue  # a line torn by a crash mid-write
        while len(answers) > MAX_REMEMBERED_COMMANDS:
            answers.popitem(last=False)
        # Compact on start so the journal stays bounded (the running agent's job, not a trial's).
        if not self.read_only:
            _write_lines(path, answers)
        return answers

    def _writable(self) -> None:
        if self.read_only:
            raise ReadOnlyState(f"the state in {self.dir} was opened read-only")

    # --- commands ---------------------------------------------------------------------------

    def answer_for(self, command_id: str) -> dict[str, Any] | None:
        stored = self.answers.get(command_id)
        return None if stored is None else dict(json.loads(stored))

    def remember_answer(self, command_id: str, ack: dict[str, Any]) -> None:
        self._writable()
        self.answers[command_id] = json.dumps(ack)
        with open(self.dir / "commands.jsonl", "a") as journal:
            journal.write(json.dumps({"command_id": command_id, "ack": ack}) + "\n")
            journal.flush()
            os.fsync(journal.fileno())
        # The journal may hold twice as many (compacted only then: a rewrite per answer would
        # be a lot of fsync'd writing); a restart keeps the newest MAX_REMEMBERED_COMMANDS, the
        # same ones as memory.
        while len(self.answers) > MAX_REMEMBERED_COMMANDS:
            self.answers.popitem(last=False)
        self._journaled += 1
        if self._journaled > 2 * MAX_REMEMBERED_COMMANDS:
            _write_lines(self.dir / "commands.jsonl", self.answers)
            self._journaled = len(self.answers)

    # --- epochs -----------------------------------------------------------------------------

    def stale_epoch(self, gpu_indices: list[int] | tuple[int, ...], epoch: int) -> int | None:
        """The newer epoch already seen on one of these GPUs, if the command's is older."""
        newest = max((self.epochs.get(i, -1) for i in gpu_indices), default=-1)
        return newest if epoch < newest else None

    def note_epoch(self, gpu_indices: list[int] | tuple[int, ...], epoch: int) -> None:
        self._writable()
        for index in gpu_indices:
            self.epochs[index] = max(epoch, self.epochs.get(index, -1))
        _write_atomic(self.dir / "epochs.json", {str(k): v for k, v in self.epochs.items()})

    # --- claims -----------------------------------------------------------------------------

    def save_claim(self, claim: Claim) -> None:
        self.claims[claim.lease_id] = claim
        self._save_claims()

    def drop_claim(self, lease_id: str) -> None:
        if self.claims.pop(lease_id, None) is not None:
            self._save_claims()

    def _save_claims(self) -> None:
        self._writable()
        _write_atomic(self.dir / "claims.json", {k: asdict(v) for k, v in self.claims.items()})


def _write_lines(path: Path, answers: OrderedDict[str, str]) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        for command_id, ack in answers.items():
            handle.write(json.dumps({"command_id": command_id, "ack": json.loads(ack)}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
