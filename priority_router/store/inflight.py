"""The per-client in-flight set in Redis (``mode="inflight"``).

One Redis set per active client holds the documents published and not yet finished;
``pending = 1 - SCARD`` at a publish (the first document with nothing in flight is
checked at 0, as in the seed mode), and ``pending = 0`` when the set is gone.

- A counted publish is ``MULTI; SADD key m; SCARD key; PEXPIRE key ms; EXEC``: one
  atomic round trip, sent pre-packed like the seed check (``packed.py``); a second
  publish of the same task id adds nothing.
- The end of a document is ``MULTI; SREM key m; PEXPIRE key ms; EXEC`` on the worker.
  ``SREM`` removes a member at most once, so duplicate end events, redeliveries and
  ends of documents that were never added change nothing: each document is ended
  exactly once and the count never rises above "nothing in flight".  Redis deletes a
  set whose last member goes.
- The TTL stays the idle reset, as a safety net for ends lost to crashes: every publish
  and every end re-arms it, so a set is dropped only after ``reset_interval`` seconds
  without either.

The member ``m`` is a 64-bit BLAKE2b digest of the task id, written as a signed decimal
integer: Redis keeps a set of up to 512 integers as an ``intset``, 8 bytes a member
(a UUID's 36 characters would make it a hash table of strings, about 60 bytes a member
on Redis 7.0).  Two in-flight documents of one client share a member with probability
about k**2 / 2**65 for k documents in flight (3e-14 for a thousand).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import redis

from .keys import INFLIGHT_SUFFIX, client_id_from_inflight_key, inflight_key
from .keyspace import ClientKeys, Layout
from .packed import CACHE_SIZE, EXEC, MULTI, bulk, command, supports, transact


def member(task_id: str) -> bytes:
    """The set member that stands for ``task_id``: a signed 64-bit integer, in decimal."""
    digest = hashlib.blake2b(task_id.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return b"%d" % int.from_bytes(digest, "big", signed=True)


#: One set per client: the documents published and not finished.
INFLIGHT = Layout(
    key=inflight_key,
    client_of=client_id_from_inflight_key,
    suffix=INFLIGHT_SUFFIX,
    read="scard",
    pending=lambda value: 1 - int(value) if value else None,
)


class InflightCounter(ClientKeys):
    """Atomic per-client publishes and ends on one Redis (or Redis Cluster) connection."""

    def __init__(self, client: redis.Redis, prefix: str, reset_interval: float) -> None:
        super().__init__(client, prefix, reset_interval, INFLIGHT)
        self._expiry = str(self._interval_ms).encode()
        #: Per key: the packed bytes before and after the member.
        self._packed: dict[str, tuple[bytes, bytes]] = {}
        self._packs = supports(client)
        self._add: Callable[[str, bytes], int] = self._packed_add if self._packs else self._pipelined_add

    def check(self, client_id: str, task_id: str) -> int:
        """One counted publish of document ``task_id``; returns the new pending count."""
        return 1 - self._add(inflight_key(self._prefix, client_id), member(task_id))

    def end(self, client_id: str, task_id: str) -> bool:
        """The end of document ``task_id``; True when this call ended it (at most once)."""
        key = inflight_key(self._prefix, client_id)
        m = member(task_id)
        if self._packs:
            # Packed like the publish: on a worker this runs once per document.
            raw = key.encode()
            packed = MULTI + command(b"SREM", raw, m) + command(b"PEXPIRE", raw, self._expiry) + EXEC
            return bool(transact(self._redis.connection_pool, packed, 2)[0])
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.srem(key, m)
            pipe.pexpire(key, self._interval_ms)
            removed, _ = pipe.execute()
        return bool(removed)

    # -- the publish's round trip -------------------------------------------------------

    def _packed_add(self, key: str, m: bytes) -> int:
        parts = self._packed.get(key)
        if parts is None:
            parts = self._pack(key)
        return int(transact(self._redis.connection_pool, parts[0] + bulk(m) + parts[1], 3)[1])

    def _pack(self, key: str) -> tuple[bytes, bytes]:
        raw = key.encode()
        head = MULTI + b"*3\r\n$4\r\nSADD\r\n" + bulk(raw)
        tail = command(b"SCARD", raw) + command(b"PEXPIRE", raw, self._expiry) + EXEC
        if len(self._packed) >= CACHE_SIZE:
            self._packed.clear()
        self._packed[key] = (head, tail)
        return head, tail

    def _pipelined_add(self, key: str, m: bytes) -> int:
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.sadd(key, m)
            pipe.scard(key)
            pipe.pexpire(key, self._interval_ms)
            _, card, _ = pipe.execute()
        return int(card)
