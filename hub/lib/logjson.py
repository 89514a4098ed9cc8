"""The hub's ``LOG_FORMAT=json`` formatter: the agent's (supplier_agent/logjson.py, one format
for the whole fleet) with the hub's full redaction (hub/lib/redact.py: tokens, legacy token
paths, secret query values)."""

from __future__ import annotations

from hub.lib.redact import redact
from supplier_agent.logjson import JsonFormatter


class HubJsonFormatter(JsonFormatter):
    def __init__(self) -> None:
        super().__init__(redact=redact)
