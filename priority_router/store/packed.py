"""The counter's check as one pre-packed transaction: the publish hot path.

A check is ``MULTI; INCR key; PEXPIRE key ms; EXEC`` (``INCRBY key n`` for a batch).
Sent through redis-py's ``pipeline(transaction=True)`` it costs the client more than a
``PING``: most of that is the pipeline object, per-command packing and response
callbacks, not the network.  Here the bytes are packed once per client and cached, then
written on a connection from the client's own pool and the four replies read back, which
costs the client less than a ``PING`` (``bench/check_cost.py``; docs/performance.md).
The server runs exactly the same transaction, so its capacity is unchanged
(``bench/counter_throughput.py``), it stays atomic, and a key never exists without its
expiry.

Only a plain ``redis.Redis`` (direct, Unix socket, TLS or Sentinel-managed) is driven
this way; any other client (Redis Cluster, a single-connection client) gets the same
transaction through redis-py's pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

#: Packed checks kept per counter; clients beyond it are packed again when they return.
CACHE_SIZE = 4096


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(value), value)


def command(*parts: bytes) -> bytes:
    """One command, packed as RESP."""
    return b"*%d\r\n" % len(parts) + b"".join(bulk(p) for p in parts)


MULTI = command(b"MULTI")
EXEC = command(b"EXEC")


def supports(client: object) -> bool:
    """Whether ``client`` is a plain pooled ``redis.Redis`` that :func:`transact` can drive."""
    return (
        isinstance(client, redis.Redis)
        and getattr(client, "connection", None) is None
        and callable(getattr(getattr(client, "connection_pool", None), "get_connection", None))
    )


def transact(pool: redis.ConnectionPool, packed: bytes, queued: int) -> list[Any]:
    """Send one pre-packed ``MULTI ... EXEC`` of ``queued`` commands on a pooled connection;
    the replies of ``EXEC``.  A command that failed inside the transaction is raised."""
    # +OK for MULTI and +QUEUED per command come before EXEC's replies.
    replies: list[Any] = _exchange(pool, packed, queued + 2)
    for value in replies:
        if isinstance(value, Exception):
            raise value  # e.g. WRONGTYPE: the key holds something else
    return replies


def call(pool: redis.ConnectionPool, packed: bytes) -> Any:
    """Send one pre-packed command on a pooled connection; its reply (an error reply is raised)."""
    return _exchange(pool, packed, 1)


def _exchange(pool: redis.ConnectionPool, packed: bytes, replies: int) -> Any:
    """Write ``packed`` on a connection of ``pool`` and read ``replies`` replies; the last."""
    conn = pool.get_connection()
    try:
        conn.send_packed_command([packed])  # type: ignore[no-untyped-call]
        for _ in range(replies - 1):
            conn.read_response()
        return conn.read_response()
    except BaseException:
        # Replies may be left unread on the socket; it must not serve another command.
        conn.disconnect()  # type: ignore[no-untyped-call]
        raise
    finally:
        pool.release(conn)


@dataclass(frozen=True)
class Extras:
    """A check's use of the client's extras key (``costs.py``): add ``add`` units, or
    only read it (``add == 0``); either way its expiry is re-armed with the count's."""

    key: str
    add: int = 0


def check_tail(expiry: bytes, key: bytes, read_key: str | None, extras: Extras | None) -> tuple[bytes, int]:
    """What follows a check's count command: ``PEXPIRE key``, then ``GET read_key`` and the
    extras' ``INCRBY`` (or ``GET``) and ``PEXPIRE`` when given, then ``EXEC``; and how many
    commands that queues."""
    parts = [command(b"PEXPIRE", key, expiry)]
    if read_key is not None:
        parts.append(command(b"GET", read_key.encode()))
    if extras is not None:
        raw = extras.key.encode()
        parts.append(command(b"INCRBY", raw, b"%d" % extras.add) if extras.add else command(b"GET", raw))
        parts.append(command(b"PEXPIRE", raw, expiry))
    return b"".join((*parts, EXEC)), len(parts)


def check_replies(replies: list[Any], read: bool, extras: bool) -> tuple[int, Any, int]:
    """(the count command's answer, what ``GET read_key`` answered, the extras' value)."""
    stored = replies[2] if read else None
    total = replies[3 if read else 2] if extras else None
    return int(replies[0]), stored, 0 if total is None else int(total)


class PackedCheck:
    """``add(key, n, extras)``: the key's new value after ``INCRBY n`` with its expiry
    re-armed; with ``read_key`` given, what ``GET read_key(key)`` answered in the same
    transaction; and with ``extras``, the client's extras after the check."""

    def __init__(
        self, client: redis.Redis, interval_ms: int, read_key: Callable[[str], str] | None = None
    ) -> None:
        self._client = client
        self._pool = client.connection_pool
        self._expiry = str(interval_ms).encode()
        self._read_key = read_key
        #: One document's check per key and extras key read or not: the hot path's shapes.
        self._packed: dict[tuple[str, str | None], tuple[bytes, int]] = {}

    def add(self, key: str, n: int = 1, extras: Extras | None = None) -> tuple[int, Any, int]:
        cached = n == 1 and (extras is None or not extras.add)
        shape = (key, None if extras is None else extras.key)
        packed = self._packed.get(shape) if cached else None
        if packed is None:
            packed = self._pack(key, n, extras)
            if cached:
                if len(self._packed) >= CACHE_SIZE:
                    self._packed.clear()
                self._packed[shape] = packed
        replies = transact(self._pool, packed[0], packed[1])
        return check_replies(replies, self._read_key is not None, extras is not None)

    def _pack(self, key: str, n: int, extras: Extras | None = None) -> tuple[bytes, int]:
        raw = key.encode()
        count = command(b"INCR", raw) if n == 1 else command(b"INCRBY", raw, str(n).encode())
        read_key = self._read_key(key) if self._read_key is not None else None
        tail, queued = check_tail(self._expiry, raw, read_key, extras)
        return MULTI + count + tail, queued + 1


def pipelined_add(
    client: redis.Redis, interval_ms: int, read_key: Callable[[str], str] | None = None
) -> Callable[..., tuple[int, Any, int]]:
    """The same transaction through redis-py's pipeline, for clients :class:`PackedCheck`
    cannot drive (Redis Cluster runs it on the key's slot: ``read_key`` and the extras key
    must share it)."""

    def add(key: str, n: int = 1, extras: Extras | None = None) -> tuple[int, Any, int]:
        with client.pipeline(transaction=True) as pipe:
            pipe.incrby(key, n)
            pipe.pexpire(key, interval_ms)
            if read_key is not None:
                pipe.get(read_key(key))
            if extras is not None:
                if extras.add:
                    pipe.incrby(extras.key, extras.add)
                else:
                    pipe.get(extras.key)
                pipe.pexpire(extras.key, interval_ms)
            replies = pipe.execute()
        return check_replies(replies, read_key is not None, extras is not None)

    return add
