"""What the agent keeps and sends of a lease's output stays within its budgets (issue 23)."""

from __future__ import annotations

from supplier_agent import logs
from supplier_agent.logs import LogPump
from supplier_agent.protocol import MAX_LOG_CHUNK_BYTES


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _run(bursts: list[bytes], seconds: int) -> tuple[list[tuple[float, str]], int]:
    """Feed ``bursts`` at the start of every second (as Docker's stream hands them over, in
    pieces), flushing as the follower's ticker does; the chunks with their times, bytes fed."""
    clock = _Clock()
    sent: list[tuple[float, str]] = []
    pump = LogPump(lambda text: sent.append((clock.now, text)), clock=clock)
    fed = 0
    ticks_per_s = 20  # finer than the chunk rate: the pump, not the ticker, sets the pace
    for second in range(seconds):
        for tick in range(ticks_per_s):
            clock.now = 1000.0 + second + tick / ticks_per_s
            if tick == 0:
                for burst in bursts:
                    pump.feed(burst)
                    fed += len(burst)
            pump.flush()
    clock.now += 1
    pump.flush(final=True)
    return sent, fed


def test_a_burst_within_the_byte_budget_is_not_dropped() -> None:
    # 64 KiB once a second, in 8 KiB reads: exactly the byte budget, far from a flood.
    burst = [b"y" * 8191 + b"\n"] * 8
    assert sum(map(len, burst)) == logs.BYTES_PER_S

    sent, fed = _run(burst, seconds=10)

    text = "".join(data for _, data in sent)
    assert "dropped" not in text
    assert len(text) == fed


def test_chunks_stay_within_the_frame_and_the_chunk_rate() -> None:
    sent, _ = _run([b"z" * 8192] * 8, seconds=5)

    assert all(len(data.encode()) <= MAX_LOG_CHUNK_BYTES for _, data in sent)
    for second in range(5):
        in_second = [at for at, _ in sent if 1000 + second <= at < 1001 + second]
        assert len(in_second) <= logs.CHUNKS_PER_S


def test_a_flood_is_cut_to_the_byte_budget_with_a_marker() -> None:
    # Ten times the budget every second.
    sent, fed = _run([b"f" * 8192] * 80, seconds=5)

    text = "".join(data for _, data in sent)
    assert "bytes dropped ...]" in text
    kept = text.count("f")
    assert kept <= logs.BYTES_PER_S * 6
    dropped = sum(int(part.split(" bytes dropped")[0]) for part in text.split("[... ")[1:])
    assert kept + dropped == fed


def test_control_characters_are_counted_as_they_travel() -> None:
    # Each \x01 costs six bytes escaped in JSON: chunks still fit the frame.
    sent, fed = _run([b"\x01" * 8192] * 4, seconds=2)

    assert all(logs._escaped_size(data) <= MAX_LOG_CHUNK_BYTES for _, data in sent)
    assert sum(len(data) for _, data in sent) == fed
