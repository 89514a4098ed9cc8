"""The web process's cache of accepted agent tokens (hub/agents/token_cache.py), on a fake
clock; tests/hub/agents/test_agent_socket.py covers it through the socket."""

from __future__ import annotations

from hub.agents import token_cache
from hub.lib.tokens import generate_token


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_accepted_token_is_known_until_its_ttl_passes() -> None:
    clock = Clock()
    cache = token_cache.AcceptedTokens(ttl_s=lambda: 60.0, clock=clock)
    plaintext = generate_token()
    assert cache.lookup(plaintext) is None
    cache.remember(plaintext, 7)
    assert cache.lookup(plaintext) == 7
    assert cache.lookup(generate_token()) is None
    clock.now += 59.9
    assert cache.lookup(plaintext) == 7
    clock.now += 0.1
    assert cache.lookup(plaintext) is None


def test_forget_drops_every_entry_of_the_token_and_no_other() -> None:
    cache = token_cache.AcceptedTokens(ttl_s=lambda: 60.0, clock=Clock())
    kept, dropped = generate_token(), generate_token()
    cache.remember(kept, 1)
    cache.remember(dropped, 2)
    cache.forget(2)
    assert cache.lookup(dropped) is None
    assert cache.lookup(kept) == 1


def test_a_ttl_of_0_turns_it_off() -> None:
    cache = token_cache.AcceptedTokens(ttl_s=lambda: 0.0, clock=Clock())
    plaintext = generate_token()
    cache.remember(plaintext, 1)
    assert cache.lookup(plaintext) is None
    assert len(cache) == 0


def test_it_keeps_digests_only_and_stays_bounded() -> None:
    clock = Clock()
    cache = token_cache.AcceptedTokens(ttl_s=lambda: 60.0, clock=clock)
    plaintext = generate_token()
    cache.remember(plaintext, 1)
    assert plaintext not in repr(cache._entries)
    for n in range(token_cache.MAX_ENTRIES + 5):
        cache.remember(f"t{n}", n)
    assert len(cache) <= token_cache.MAX_ENTRIES
