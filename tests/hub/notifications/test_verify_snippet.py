"""The verification snippet docs/webhooks.md gives receivers accepts signatures made by
hub/notifications/signing.py (the code every delivery is signed with) and refuses a changed
body, another secret and an old timestamp."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from hub.notifications import signing

DOC = Path(__file__).resolve().parents[3] / "docs" / "webhooks.md"


def _snippet_verify() -> Callable[..., bool]:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert len(blocks) == 1, "docs/webhooks.md shows one Python block"
    namespace: dict[str, object] = {}
    exec(compile(blocks[0], str(DOC), "exec"), namespace)  # noqa: S102  # our own docs
    return namespace["verify"]  # type: ignore[return-value]


def test_the_documented_check_agrees_with_the_hub() -> None:
    verify = _snippet_verify()
    secret, body = signing.new_secret(), b'{"id":"e1","type":"rental.ended"}'
    now = int(time.time())
    header = signing.header(secret, now, body)
    assert verify(secret, header, body)
    assert not verify(secret, header, body.replace(b"e1", b"e2"))
    assert not verify(signing.new_secret(), header, body)
    assert not verify(secret, signing.header(secret, now - 600, body), body)
    assert not verify(secret, "garbage", body)
