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
from collections.abc import Callable, Iterator

import redis

from .counter import CounterState
from .keys import client_id_from_inflight_key, glob_escape, inflight_key
from .packed import CACHE_SIZE, PackedCheck, _bulk, _command

_MULTI = _command(b"MULTI")
_EXEC = _command(b"EXEC")


def member(task_id: str) -> bytes:
    """The set member that stands for ``task_id``: a signed 64-bit integer, in decimal."""
    digest = hashlib.blake2b(task_id.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return b"%d" % int.from_bytes(digest, "big", signed=True)


class InflightCounter:
    """Atomic per-client publishes and ends on one Redis (or Redis Cluster) connection."""

    def __init__(self, client: redis.Redis, prefix: str, reset_interval: float) -> None:
        self._redis = client
        self._prefix = prefix
        self._interval_ms = max(1, round(reset_interval * 1000))
        self._expiry = str(self._interval_ms).encode()
        self._pattern = glob_escape(prefix) + "{*}" + glob_escape(":i")
        #: Per key: the packed bytes before and after the member.
        self._packed: dict[str, tuple[bytes, bytes]] = {}
        self._add: Callable[[str, bytes], int] = (
            self._packed_add if PackedCheck.supports(client) else self._pipelined_add
        )

    @property
    def reset_interval_ms(self) -> int:
        return self._interval_ms

    def key(self, client_id: str) -> str:
        return inflight_key(self._prefix, client_id)

    def check(self, client_id: str, task_id: str) -> int:
        """One counted publish of document ``task_id``; returns the new pending count."""
        return 1 - self._add(inflight_key(self._prefix, client_id), member(task_id))

    def end(self, client_id: str, task_id: str) -> bool:
        """The end of document ``task_id``; True when this call ended it (at most once)."""
        key = inflight_key(self._prefix, client_id)
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.srem(key, member(task_id))
            pipe.pexpire(key, self._interval_ms)
            removed, _ = pipe.execute()
        return bool(removed)

    def read(self, client_id: str) -> CounterState:
        key = self.key(client_id)
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.scard(key)
            pipe.pttl(key)
            card, ttl = pipe.execute()
        if not card:
            return CounterState(client_id, 0, key, None)
        return CounterState(client_id, 1 - int(card), key, ttl if ttl >= 0 else None)

    def clear(self, client_id: str) -> bool:
        return bool(self._redis.delete(self.key(client_id)))

    def scan(self, count: int = 500) -> Iterator[CounterState]:
        batch: list[str] = []
        for key in self._redis.scan_iter(match=self._pattern, count=count):
            batch.append(key.decode() if isinstance(key, bytes) else key)
            if len(batch) >= count:
                yield from self._read_keys(batch)
                batch = []
        if batch:
            yield from self._read_keys(batch)

    def clear_all(self, count: int = 500) -> int:
        deleted = 0
        batch: list[bytes | str] = []
        for key in self._redis.scan_iter(match=self._pattern, count=count):
            batch.append(key)
            if len(batch) >= count:
                deleted += int(self._redis.unlink(*batch))
                batch = []
        if batch:
            deleted += int(self._redis.unlink(*batch))
        return deleted

    def _read_keys(self, keys: list[str]) -> Iterator[CounterState]:
        with self._redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.scard(key)
                pipe.pttl(key)
            replies = pipe.execute()
        for i, key in enumerate(keys):
            card, ttl = replies[2 * i], replies[2 * i + 1]
            client_id = client_id_from_inflight_key(self._prefix, key)
            if not card or client_id is None:
                continue
            yield CounterState(client_id, 1 - int(card), key, ttl if ttl >= 0 else None)

    # -- the publish's round trip -------------------------------------------------------

    def _packed_add(self, key: str, m: bytes) -> int:
        parts = self._packed.get(key)
        if parts is None:
            parts = self._pack(key)
        pool = self._redis.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command([parts[0] + _bulk(m) + parts[1]])  # type: ignore[no-untyped-call]
            conn.read_response()  # +OK for MULTI
            conn.read_response()  # +QUEUED
            conn.read_response()  # +QUEUED
            conn.read_response()  # +QUEUED
            replies = conn.read_response()
        except BaseException:
            conn.disconnect()  # type: ignore[no-untyped-call]
            raise
        finally:
            pool.release(conn)
        for value in replies:
            if isinstance(value, Exception):
                raise value  # e.g. WRONGTYPE
        return int(replies[1])

    def _pack(self, key: str) -> tuple[bytes, bytes]:
        raw = key.encode()
        head = _MULTI + b"*3\r\n$4\r\nSADD\r\n" + _bulk(raw)
        tail = _command(b"SCARD", raw) + _command(b"PEXPIRE", raw, self._expiry) + _EXEC
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
