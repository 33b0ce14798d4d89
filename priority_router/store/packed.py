"""The counter's check as one pre-packed transaction: the publish hot path.

A check is ``MULTI; INCR key; PEXPIRE key ms; EXEC`` (``INCRBY key n`` for a batch).
Sent through redis-py's ``pipeline(transaction=True)`` it costs the client more than a
``PING``: most of that is the pipeline object, per-command packing and response
callbacks, not the network.  Here the bytes are packed once per client and cached, then
written on a connection from the client's own pool and the four replies read back, which
costs the client less than a ``PING`` (``bench/publish.py check``; docs/performance.md).
The server runs exactly the same transaction, so its capacity is unchanged
(``bench/store.py throughput``), it stays atomic, and a key never exists without its
expiry.

A plain ``redis.Redis`` (direct, Unix socket, TLS or Sentinel-managed) and Redis Cluster
are driven this way; on a cluster the bytes go to the pool of the master that serves the
key's slot (:class:`SlotMaster`), still one round trip to one master.  A single-connection
client gets the same transaction through redis-py's pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, MovedError, SlotNotCoveredError

from .connection import LazyCluster, is_cluster

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
ASKING = command(b"ASKING")

#: ``exchange(key, packed, replies)``: write ``packed`` to the server that holds ``key`` and
#: read ``replies`` replies; the last (an error reply is raised).
Exchange = Callable[[bytes, bytes, int], Any]


def supports(client: object) -> TypeGuard[redis.Redis]:
    """Whether ``client`` is a plain pooled ``redis.Redis`` that :func:`transact` can drive."""
    return (
        isinstance(client, redis.Redis)
        and getattr(client, "connection", None) is None
        and callable(getattr(getattr(client, "connection_pool", None), "get_connection", None))
    )


def exchange_for(client: object) -> Exchange | None:
    """How pre-packed bytes reach ``client``'s server; None for a client they cannot reach
    (a single-connection ``redis.Redis``), which gets the same commands through redis-py."""
    if is_cluster(client):
        return SlotMaster(client)  # type: ignore[arg-type]  # is_cluster says which
    if not supports(client):
        return None
    pool = client.connection_pool
    return lambda _key, packed, replies: _exchange(pool, packed, replies)


def transact(exchange: Exchange, key: bytes, packed: bytes, queued: int) -> list[Any]:
    """Send one pre-packed ``MULTI ... EXEC`` of ``queued`` commands on ``key``'s slot; the
    replies of ``EXEC``.  A command that failed inside the transaction is raised."""
    # +OK for MULTI and +QUEUED per command come before EXEC's replies.
    replies: list[Any] = exchange(key, packed, queued + 2)
    for value in replies:
        if isinstance(value, Exception):
            raise value  # e.g. WRONGTYPE: the key holds something else
    return replies


def call(exchange: Exchange, key: bytes, packed: bytes) -> Any:
    """Send one pre-packed command on ``key``'s slot; its reply (an error reply is raised)."""
    return exchange(key, packed, 1)


class SlotMaster:
    """Packed bytes sent to the master that serves the key's slot, on that node's own pool.

    redis-py's cluster pipeline sends the same one write to the same master, but builds a
    pipeline, packs each command and runs its callbacks: about three times the client CPU
    of the packed check (``bench/publish.py cluster-check``).  The slot map is redis-py's own, and
    it is kept up to date as redis-py's cluster client keeps it:

    - ``MOVED`` (the slot was resharded, or failed over and seen from the promoted
      replica): nothing ran (a transaction with a redirected command is refused at
      ``EXEC``), so the map takes the new owner and the bytes go there, once more;
    - ``ASK`` (the slot is migrating and the key already left): they go to the importing
      master once, after ``ASKING``; the map is left as it is, as the migration has not
      finished;
    - a connection error, a timeout, ``CLUSTERDOWN``: what was sent may have run, so it is
      never sent again (the check fails open, as on one Redis); the map is read again, so
      the next check finds a promoted replica.
    """

    def __init__(self, client: RedisCluster | LazyCluster) -> None:
        self._client = client

    def __call__(self, key: bytes, packed: bytes, replies: int) -> Any:
        client = self._client
        # A LazyCluster is built at its first check, not before (connection.py).
        cluster = client.cluster if isinstance(client, LazyCluster) else client
        slot = key_slot(key)
        try:
            try:
                return _exchange(_master_pool(cluster, slot), packed, replies)
            except MovedError as moved:
                cluster.nodes_manager.move_slot(moved)
                return _exchange(_master_pool(cluster, slot), packed, replies)
            except AskError as ask:
                node = cluster.nodes_manager.get_node(ask.host, ask.port)
                if node is None:
                    raise
                pool = cluster.get_redis_connection(node).connection_pool
                return _exchange(pool, ASKING + packed, replies + 1)
        except (redis.ConnectionError, redis.TimeoutError, OSError, ClusterDownError, SlotNotCoveredError):
            cluster.nodes_manager.initialize()
            raise


def _master_pool(cluster: RedisCluster, slot: int) -> redis.ConnectionPool:
    nodes = cluster.nodes_manager.slots_cache.get(slot)
    if not nodes:
        raise SlotNotCoveredError(f"slot {slot} is not covered by the cluster")
    pool: redis.ConnectionPool = cluster.get_redis_connection(nodes[0]).connection_pool
    return pool


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
        self, exchange: Exchange, interval_ms: int, read_key: Callable[[str], str] | None = None
    ) -> None:
        self._exchange = exchange
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
        replies = transact(self._exchange, key.encode(), packed[0], packed[1])
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
    cannot drive (a single-connection client).  On Redis Cluster, where :class:`PackedCheck`
    also runs, the transaction runs on the key's slot: ``read_key`` and the extras key must
    share it."""

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
