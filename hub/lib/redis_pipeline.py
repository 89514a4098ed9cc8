"""Several Redis commands in one round trip, without redis-py's ``Pipeline`` object.

The heartbeats' group commit (hub.agents.heartbeat_batch) writes a small pipeline for nearly
every heartbeat: at 10,000 agents held, ~600 a second from one web process. redis-py's
``Pipeline`` adds a command stack, its retry helper and a reply callback per command to the
round trip; without them a one-host write costs the process ~14 us (10 %) less CPU of its
~140 us, the rest being the socket round trip itself (bench/group_commit_cost.py,
docs/benchmarks.md, issue 15). :func:`send` packs, sends and reads, on a connection of the
caller's pool, through the connection's public methods (``pack_commands``,
``send_packed_command``, ``read_response``, ``disconnect``) and the pool's (``get_connection``,
``release``), which are what ``Pipeline`` itself calls.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import ConnectionPool

Command = Sequence[str | bytes | int | float]


async def send(pool: ConnectionPool, commands: Sequence[Command]) -> list[object]:
    """Each command's reply, in order. An error reply raises ``ResponseError`` (the commands
    before it ran, and those after it were sent too), a lost connection ``ConnectionError``
    or ``TimeoutError``: all ``RedisError``."""
    if not commands:
        return []
    # redis-py 5.2 leaves get_connection unannotated; it returns the pool's connection class.
    connection = await pool.get_connection(str(commands[0][0]))  # type: ignore[no-untyped-call]
    try:
        await connection.send_packed_command(connection.pack_commands(commands))
        return [await connection.read_response() for _ in commands]
    except BaseException:
        # Replies may be left unread (an error reply, a cancel): never lend it on half-read.
        await connection.disconnect()
        raise
    finally:
        await pool.release(connection)
