"""Hub-driven upgrades: the messages of a staged rollout, both directions.

The hub's rollout (hub/rollouts/) tells the agents of a wave to ``upgrade`` to the version it
serves at ``/agent/release.json``; the agent runs ``cloudgpu-agent upgrade`` (the same checks as
a supplier's own: signature, sha256, smoke, trial or health window) and says how it went with
``upgrade_status``. A wave that does not hold up is told to ``rollback``: back to the version the
host ran before. The version the agent then registers with is what the hub believes in the
end; ``upgrade_status`` says why, for the fleet page. Not Commands: no lease, no epoch, and
a repeat is harmless (an agent already at the version, or with an upgrade running, says so).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from typing_extensions import Self

from supplier_agent.protocol_schema import Message, ProtocolError, _known, _str, _uuid

# As upgrade_fetch's rule for a release's version: it names a folder under the prefix.
_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!_-]{0,63}$")
MAX_DETAIL_CHARS = 2000
UPGRADE_STATES = ("started", "switched", "failed", "refused", "rolled_back")


def _version(value: Any, where: str) -> str:
    text = _str(value, where, max_len=64)
    if not _VERSION.match(text):
        raise ProtocolError(f"{where}: {text!r} is not a version")
    return text


@dataclass(frozen=True)
class _Order(Message):
    """What the hub tells one host of a rollout: the rollout and a version."""

    rollout_id: str
    version: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        _known(data, {"rollout_id", "version"}, cls.TYPE)
        return cls(
            rollout_id=_uuid(data.get("rollout_id"), f"{cls.TYPE}.rollout_id"),
            version=_version(data.get("version"), f"{cls.TYPE}.version"),
        )


@dataclass(frozen=True)
class Upgrade(_Order):
    """Install ``version``, the release the hub serves now, as ``cloudgpu-agent upgrade``
    would (``failed``, nothing changed, if the hub serves another by the time it asks)."""

    TYPE: ClassVar[str] = "upgrade"


@dataclass(frozen=True)
class Rollback(_Order):
    """Go back to ``version``, the one this host ran before the rollout's upgrade (kept under
    the prefix by ``upgrade``); nothing happens on a host that runs it already."""

    TYPE: ClassVar[str] = "rollback"


@dataclass(frozen=True)
class UpgradeStatus(Message):
    """How an ``upgrade`` or ``rollback`` went: ``started``; ``switched`` (the new version is
    installed and this agent restarts into it); ``failed`` (nothing changed, ``detail`` says
    why); ``refused`` (not tried: not an installed agent, one already running, ...);
    ``rolled_back``."""

    TYPE: ClassVar[str] = "upgrade_status"
    rollout_id: str
    version: str
    state: str
    detail: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UpgradeStatus:
        _known(data, {"rollout_id", "version", "state", "detail"}, "upgrade_status")
        state = _str(data.get("state"), "upgrade_status.state", max_len=16)
        if state not in UPGRADE_STATES:
            raise ProtocolError(f"upgrade_status.state must be one of {', '.join(UPGRADE_STATES)}")
        return cls(
            rollout_id=_uuid(data.get("rollout_id"), "upgrade_status.rollout_id"),
            version=_version(data.get("version"), "upgrade_status.version"),
            state=state,
            detail=_str(
                data.get("detail", ""),
                "upgrade_status.detail",
                max_len=MAX_DETAIL_CHARS,
                allow_empty=True,
            ),
        )
