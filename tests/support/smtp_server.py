"""A real SMTP server (aiosmtpd) on loopback that keeps every message it accepts and refuses
the recipients it is told to; and a mail server that accepts connections and never answers."""

from __future__ import annotations

import email
import email.policy
import socket
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
    # Recipients answered "550 no such mailbox".
    refused: set[str] = field(default_factory=set)

    def to(self, address: str) -> list[EmailMessage]:
        with self.lock:
            return [m for m in self.messages if address in str(m["To"])]


class _Handler:
    def __init__(self, mailbox: Mailbox) -> None:
        self.mailbox = mailbox

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, rcpt_options: Any
    ) -> str:
        if address in self.mailbox.refused:
            return "550 5.1.1 no such mailbox"
        envelope.rcpt_tos.append(address)
        return "250 OK"

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


@contextmanager
def hanging_smtp_server() -> Iterator[int]:
    """A port where connections are taken (the kernel's backlog) and no greeting ever comes,
    as a mail server that hangs: every client waits its whole timeout."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
