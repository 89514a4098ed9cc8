"""``LOG_FORMAT=json``: one JSON object per log line, for the agent and (through
hub/lib/logjson.py) every hub process, so a log pipeline can filter by host, lease or command.

Fields: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``msg``, ``exc`` (a traceback, if any),
and whichever ids are known: from ``extra={...}`` on the call, else bound to the current task
or thread with ``bind()`` (the hub's agent socket binds its host once registered). Standard
library only: the agent installs with its own few dependencies.

Tokens: every string that leaves passes through ``redact``; the agent's default hides anything
shaped like a CloudGPU token (``cgpu_``/``cgpr_``/``cgpe_``/``cgpa_`` followed by its secret).
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

ID_FIELDS = ("host_id", "agent_id", "lease_id", "command_id", "session_id", "gpu_index")
_TOKEN = re.compile(r"(cgp[upea])(?:_|%5f)[0-9A-Za-z_:%-]{20,}", re.IGNORECASE)

_bound: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "cloudgpu_log_ids", default=None
)


def redact_tokens(text: str) -> str:
    return _TOKEN.sub(r"\1_[redacted]", text)


def bind(**ids: Any) -> None:
    """Ids every later line of this task (or thread) carries; None removes one."""
    current = dict(_bound.get() or {})
    for key, value in ids.items():
        if value is None:
            current.pop(key, None)
        else:
            current[key] = value
    _bound.set(current)


@contextmanager
def bound(**ids: Any) -> Iterator[None]:
    token = _bound.set({**(_bound.get() or {}), **ids})
    try:
        yield
    finally:
        _bound.reset(token)


class JsonFormatter(logging.Formatter):
    def __init__(self, redact: Callable[[str], str] | None = None) -> None:
        super().__init__()
        self._redact = redact or redact_tokens

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": self._redact(record.getMessage()),
        }
        ids = _bound.get() or {}
        for name in ID_FIELDS:
            value = getattr(record, name, None)
            if value is None:
                value = ids.get(name)
            if value is not None:
                entry[name] = value if isinstance(value, int) else self._redact(str(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc"] = self._redact(record.exc_text)
        if record.stack_info:
            entry["stack"] = self._redact(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)
