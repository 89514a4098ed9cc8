"""A real SMTP server (aiosmtpd) on loopback that keeps every message it accepts."""

from __future__ import annotations

import email
import email.policy
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller

from hub.lib.ports import free_port


@dataclass
class Mailbox:
    port: int
    messages: list[EmailMessage] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def to(self, address: str) -> list[EmailMessage]:
        with self.lock:
            return [m for m in self.messages if address in str(m["To"])]


class _Handler:
    def __init__(self, mailbox: Mailbox) -> None:
        self.mailbox = mailbox

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
        with self.mailbox.lock:
            self.mailbox.messages.append(parsed)  # type: ignore[arg-type]
        return "250 OK"


@contextmanager
def smtp_server() -> Iterator[Mailbox]:
    mailbox = Mailbox(port=free_port())
    controller = Controller(_Handler(mailbox), hostname="127.0.0.1", port=mailbox.port)
    controller.start()
    try:
        yield mailbox
    finally:
        controller.stop()
