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

import redis

#: Packed checks kept per counter; clients beyond it are packed again when they return.
CACHE_SIZE = 4096


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def _command(*parts: bytes) -> bytes:
    return b"*%d\r\n" % len(parts) + b"".join(_bulk(p) for p in parts)


_MULTI = _command(b"MULTI")
_EXEC = _command(b"EXEC")


class PackedCheck:
    """``add(key, n)``: the key's new value after ``INCRBY n`` with its expiry re-armed."""

    def __init__(self, client: redis.Redis, interval_ms: int) -> None:
        self._client = client
        self._pool = client.connection_pool
        self._expiry = str(interval_ms).encode()
        #: One document's check per key, the hot path's only shape.
        self._packed: dict[str, bytes] = {}

    @staticmethod
    def supports(client: object) -> bool:
        """Whether ``client`` is a plain pooled ``redis.Redis`` this can drive."""
        return (
            isinstance(client, redis.Redis)
            and getattr(client, "connection", None) is None
            and callable(getattr(getattr(client, "connection_pool", None), "get_connection", None))
        )

    def add(self, key: str, n: int = 1) -> int:
        packed = self._packed.get(key) if n == 1 else None
        if packed is None:
            packed = self._pack(key, n)
        pool = self._pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command([packed])  # type: ignore[no-untyped-call]
            conn.read_response()  # +OK for MULTI
            conn.read_response()  # +QUEUED
            conn.read_response()  # +QUEUED
            replies = conn.read_response()
        except BaseException:
            # Replies may be left unread on the socket; it must not serve another command.
            conn.disconnect()  # type: ignore[no-untyped-call]
            raise
        finally:
            pool.release(conn)
        value = replies[0]
        if isinstance(value, Exception):
            raise value  # e.g. WRONGTYPE: the key holds something else
        return int(value)

    def _pack(self, key: str, n: int) -> bytes:
        raw = key.encode()
        packed = b"".join(
            (
                _MULTI,
                _command(b"INCR", raw) if n == 1 else _command(b"INCRBY", raw, str(n).encode()),
                _command(b"PEXPIRE", raw, self._expiry),
                _EXEC,
            )
        )
        if n == 1:
            if len(self._packed) >= CACHE_SIZE:
                self._packed.clear()
            self._packed[key] = packed
        return packed


def pipelined_add(client: redis.Redis, interval_ms: int) -> Callable[[str, int], int]:
    """The same transaction through redis-py's pipeline, for clients :class:`PackedCheck`
    cannot drive (Redis Cluster runs it on the key's slot)."""

    def add(key: str, n: int = 1) -> int:
        with client.pipeline(transaction=True) as pipe:
            pipe.incrby(key, n)
            pipe.pexpire(key, interval_ms)
            value, _ = pipe.execute()
        return int(value)

    return add
