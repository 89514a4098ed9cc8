"""Agent tokens this web process accepted a moment ago, so that a new socket's connect-time
token check can skip its query (issue 18).

In a reconnect storm every socket's handshake cost a thread hop, a pooled connection's health
check and the token's query: 14-18 % of the web process's samples (docs/benchmarks.md). A
supplier's hosts share a token (up to MAX_HOSTS_PER_TOKEN each), so most of those checks asked
about a token the process had accepted milliseconds before.

Why a stale "accepted" is safe here: the connect-time check only decides whether a socket may
send ``register``; everything a socket can do is behind it, and ``register`` (and its probe)
read the token again, in the same transaction as the host (registration.py). A token revoked
meanwhile is refused there. Revocation reaches registered sockets through their hosts'
channels (``revoke_agent_token``), and each such socket drops its token from this cache
(``forget``), as does a refused registration; so a revoked token stays cached in a process only
if none of its sockets there had registered, and for AGENT_TOKEN_CACHE_S at most.

Checks that miss the cache are batched (token_batch.py): sockets that arrive together, before
a token's first answer is cached (the first seconds of a storm), cost one row of one query.

Only accepted tokens are kept, keyed by digest (never the plaintext). Refusals are not cached:
a made-up token costs no query anyway (``tokens.well_formed``), and a revoked one should be
answered 403 the next time. Used on the event loop's thread only; no lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from django.conf import settings

from hub.lib import tokens

# Entries at most: past it the expired ones go, then all of them (each is one query away).
MAX_ENTRIES = 10_000


class AcceptedTokens:
    def __init__(
        self,
        ttl_s: Callable[[], float] = lambda: float(settings.AGENT_TOKEN_CACHE_S),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[str, tuple[int, float]] = {}  # digest -> (token id, expires at)
        self.hits = 0

    def lookup(self, plaintext: str | None) -> int | None:
        """The id of a token accepted within the TTL, or None (ask the database)."""
        if not plaintext or self._ttl_s() <= 0:
            return None
        entry = self._entries.get(tokens.digest(plaintext))
        if entry is None:
            return None
        token_id, expires_at = entry
        if self._clock() >= expires_at:
            return None
        self.hits += 1
        return token_id

    def remember(self, plaintext: str, token_id: int) -> None:
        ttl = self._ttl_s()
        if ttl <= 0:
            return
        now = self._clock()
        if len(self._entries) >= MAX_ENTRIES:
            self._entries = {d: e for d, e in self._entries.items() if e[1] > now}
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
        self._entries[tokens.digest(plaintext)] = (token_id, now + ttl)

    def forget(self, token_id: int) -> None:
        """Drop a token (revoked, or a registration with it refused): its next socket asks."""
        for digest in [d for d, (tid, _) in self._entries.items() if tid == token_id]:
            del self._entries[digest]

    def __len__(self) -> int:
        return len(self._entries)


accepted = AcceptedTokens()
