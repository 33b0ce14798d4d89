"""The per-client pending counter in Redis.

One string key per active client holds how many documents it submitted in the
current busy spell (``n``); ``pending = 1 - n``, so the first document of a spell
is checked at 0.  The key's TTL is the reset: every check re-arms it to
``reset_interval``, so after more than ``reset_interval`` idle seconds Redis (on its
own clock) has dropped the key and the next check starts a new spell.  Memory is
bounded by active clients.

A check is ``MULTI; INCR key; PEXPIRE key ms; EXEC``: atomic, so concurrent
publishers on many hosts lose no update, and no key is ever left without expiry.
Two native commands in a transaction serve about 1.3x the checks/s of the
equivalent Lua script (``bench/counter_throughput.py``); on the client the
transaction is sent pre-packed (``packed.py``), one round trip.  A batch of ``n``
documents is one check with ``INCRBY key n``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import redis

from .keys import client_id_from_key, client_key, glob_escape
from .packed import PackedCheck, pipelined_add


@dataclass(frozen=True)
class CounterState:
    """What Redis holds for one client."""

    client_id: str
    pending: int
    key: str
    #: Milliseconds until the key expires (the reset); None when there is no state.
    ttl_ms: int | None


class Counter:
    """Atomic per-client checks on one Redis (or Redis Cluster) connection."""

    def __init__(self, client: redis.Redis, prefix: str, reset_interval: float) -> None:
        self._redis = client
        self._prefix = prefix
        self._interval_ms = max(1, round(reset_interval * 1000))
        self._pattern = glob_escape(prefix) + "{*}"
        self._add = (
            PackedCheck(client, self._interval_ms).add
            if PackedCheck.supports(client)
            else pipelined_add(client, self._interval_ms)
        )

    @property
    def reset_interval_ms(self) -> int:
        return self._interval_ms

    def key(self, client_id: str) -> str:
        return client_key(self._prefix, client_id)

    def check(self, client_id: str) -> int:
        """One counted submission (docs/scheme.md, "One check"); returns the new pending count."""
        return 1 - self._add(client_key(self._prefix, client_id), 1)

    def check_many(self, client_id: str, n: int) -> list[int]:
        """``n`` counted submissions in one round trip: the pending count each would have
        got from ``n`` sequential checks, in order."""
        if n < 1:
            return []
        submitted = self._add(client_key(self._prefix, client_id), n)
        first = submitted - n + 1
        return [1 - s for s in range(first, submitted + 1)]

    def read(self, client_id: str) -> CounterState:
        """The client's state without changing it (pending 0 when it has none)."""
        key = self.key(client_id)
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(key)
            pipe.pttl(key)
            raw, ttl = pipe.execute()
        if raw is None:
            return CounterState(client_id, 0, key, None)
        return CounterState(client_id, 1 - int(raw), key, ttl if ttl >= 0 else None)

    def clear(self, client_id: str) -> bool:
        """Forget one client; True when it had state."""
        return bool(self._redis.delete(self.key(client_id)))

    def scan(self, count: int = 500) -> Iterator[CounterState]:
        """Every tracked client, read in SCAN batches so Redis is never blocked.

        On Redis Cluster, redis-py's ``scan_iter`` walks every master with a cursor of its
        own (``SCAN`` goes to the primaries only, never to a replica).
        """
        batch: list[str] = []
        for key in self._redis.scan_iter(match=self._pattern, count=count):
            batch.append(key.decode() if isinstance(key, bytes) else key)
            if len(batch) >= count:
                yield from self._read_keys(batch)
                batch = []
        if batch:
            yield from self._read_keys(batch)

    def clear_all(self, count: int = 500) -> int:
        """Forget every client on every master; returns how many keys were deleted."""
        deleted = 0
        batch: list[bytes | str] = []
        # On Redis Cluster, redis-py splits ``unlink(*keys)`` into one UNLINK per hash slot,
        # so a batch whose keys live on several masters never sends a cross-slot command.
        for key in self._redis.scan_iter(match=self._pattern, count=count):
            batch.append(key)
            if len(batch) >= count:
                deleted += int(self._redis.unlink(*batch))
                batch = []
        if batch:
            deleted += int(self._redis.unlink(*batch))
        return deleted

    def _read_keys(self, keys: list[str]) -> Iterator[CounterState]:
        # Single-key commands only: a Redis Cluster pipeline sends each to its key's master.
        with self._redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.get(key)
                pipe.pttl(key)
            replies = pipe.execute()
        for i, key in enumerate(keys):
            raw, ttl = replies[2 * i], replies[2 * i + 1]
            client_id = client_id_from_key(self._prefix, key)
            if raw is None or client_id is None:
                continue
            yield CounterState(client_id, 1 - int(raw), key, ttl if ttl >= 0 else None)
