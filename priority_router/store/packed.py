"""The counter's check as one pre-packed transaction: the publish hot path.

A check is ``MULTI; INCR key; PEXPIRE key ms; EXEC`` (``INCRBY key n`` for a batch).
Sent through redis-py's ``pipeline(transaction=True)`` it costs the client about 1.2 times a ``PING``: most of
that is the pipeline object, per-command packing and response callbacks, not the
network.  Here the bytes are packed once per client and cached, then written on a
connection from the client's own pool and the four replies read back: about 0.9 of a
``PING`` (``bench/check_cost.py``).  The server runs exactly the same transaction, so
its capacity is unchanged (``bench/counter_throughput.py``), it stays atomic, and a
key never exists without its expiry.

Only a plain ``redis.Redis`` (direct, Unix socket, TLS or Sentinel-managed) is driven
this way; any other client (Redis Cluster, a single-connection client) gets the same
transaction through redis-py's pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
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
    conn = pool.get_connection()
    try:
        conn.send_packed_command([packed])  # type: ignore[no-untyped-call]
        for _ in range(queued + 1):
            conn.read_response()  # +OK for MULTI, then +QUEUED per command
        replies: list[Any] = conn.read_response()
    except BaseException:
        # Replies may be left unread on the socket; it must not serve another command.
        conn.disconnect()  # type: ignore[no-untyped-call]
        raise
    finally:
        pool.release(conn)
    for value in replies:
        if isinstance(value, Exception):
            raise value  # e.g. WRONGTYPE: the key holds something else
    return replies


class PackedCheck:
    """``add(key, n)``: the key's new value after ``INCRBY n`` with its expiry re-armed, and
    with ``read_key`` given, what ``GET read_key(key)`` answered in the same transaction."""

    def __init__(
        self, client: redis.Redis, interval_ms: int, read_key: Callable[[str], str] | None = None
    ) -> None:
        self._client = client
        self._pool = client.connection_pool
        self._expiry = str(interval_ms).encode()
        self._read_key = read_key
        self._queued = 2 if read_key is None else 3
        #: One document's check per key, the hot path's only shape.
        self._packed: dict[str, bytes] = {}

    def add(self, key: str, n: int = 1) -> tuple[int, Any]:
        packed = self._packed.get(key) if n == 1 else None
        if packed is None:
            packed = self._pack(key, n)
        replies = transact(self._pool, packed, self._queued)
        return int(replies[0]), replies[2] if self._read_key is not None else None

    def _pack(self, key: str, n: int) -> bytes:
        raw = key.encode()
        parts = [
            MULTI,
            command(b"INCR", raw) if n == 1 else command(b"INCRBY", raw, str(n).encode()),
            command(b"PEXPIRE", raw, self._expiry),
        ]
        if self._read_key is not None:
            parts.append(command(b"GET", self._read_key(key).encode()))
        packed = b"".join((*parts, EXEC))
        if n == 1:
            if len(self._packed) >= CACHE_SIZE:
                self._packed.clear()
            self._packed[key] = packed
        return packed


def pipelined_add(
    client: redis.Redis, interval_ms: int, read_key: Callable[[str], str] | None = None
) -> Callable[[str, int], tuple[int, Any]]:
    """The same transaction through redis-py's pipeline, for clients :class:`PackedCheck`
    cannot drive (Redis Cluster runs it on the key's slot: ``read_key`` must share it)."""

    def add(key: str, n: int = 1) -> tuple[int, Any]:
        with client.pipeline(transaction=True) as pipe:
            pipe.incrby(key, n)
            pipe.pexpire(key, interval_ms)
            if read_key is not None:
                pipe.get(read_key(key))
            replies = pipe.execute()
        return int(replies[0]), replies[2] if read_key is not None else None

    return add
