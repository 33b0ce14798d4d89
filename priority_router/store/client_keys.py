"""What both counting modes share: one key per active client, read, listed and cleared.

A mode says how its key is named and what it holds (a :class:`Layout`); reading one
client, walking every client in ``SCAN`` batches (so Redis is never blocked) and
clearing are the same for both.  Only
single-key commands are used: on Redis Cluster a pipeline sends each to its key's
master, and redis-py's ``scan_iter`` walks every master with a cursor of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from .client_ids import client_key, glob_escape
from .costs import RESOLUTION, as_count, extras_value, sentinel_extras

T = TypeVar("T")


@dataclass(frozen=True)
class CounterState:
    """What Redis holds for one client."""

    client_id: str
    #: ``1 -`` the counted cost, as with every cost 1 (the count the seed's last document was
    #: checked at), the last document taken to cost 1 or all that is counted when less:
    #: never positive.
    pending: int | float
    key: str
    #: Milliseconds until the key expires (the reset); None when there is no state.
    ttl_ms: int | None
    #: The costs counted: in the spell (seed), of the documents in flight (inflight).
    counted: int | float = 0


@dataclass(frozen=True)
class Layout:
    """How one counting mode keeps a client in Redis."""

    #: ``key(prefix, client_id)``: the client's key.
    key: Callable[[str, str], str]
    #: ``client_of(prefix, key)``: the client id a key stands for (None: not this mode's).
    client_of: Callable[[str, str], str | None]
    #: What follows the ``{token}`` in this mode's keys ("" for none).
    suffix: str
    #: The command that reads a key's value ("get" for a seed counter, "llen" for a list).
    read: str
    #: ``documents(value)``: the documents a value counts; None when there is no state.
    documents: Callable[[Any], int | None]
    #: Ends the key of what the client's costed documents add (``costs.py``), after its hash
    #: tag; None: they are the oldest entry of the client's list.
    extras_suffix: str | None
    #: End the keys of the client's other state, cleared with it: the seed's extras, the
    #: inflight mode's order and its unconfirmed documents.
    companion_suffixes: tuple[str, ...]


class ClientKeys:
    """The keys of one counting mode on one Redis (or Redis Cluster) connection."""

    def __init__(self, client: redis.Redis, prefix: str, reset_interval: float, layout: Layout) -> None:
        self._redis = client
        self._prefix = prefix
        self._interval_ms = max(1, round(reset_interval * 1000))
        self._layout = layout
        #: Matches this mode's keys and no other (``SCAN``'s MATCH).
        self._pattern = glob_escape(prefix) + "{*}" + glob_escape(layout.suffix)
        self._companion_patterns = [
            glob_escape(prefix) + "{*}" + glob_escape(s) for s in layout.companion_suffixes
        ]

    @property
    def reset_interval_ms(self) -> int:
        return self._interval_ms

    def key(self, client_id: str) -> str:
        return self._layout.key(self._prefix, client_id)

    def extras_key(self, client_id: str) -> str | None:
        """The key of what the client's costed documents add beyond 1 each (``costs.py``);
        None when they live in the client's own key."""
        suffix = self._layout.extras_suffix
        return None if suffix is None else client_key(self._prefix, client_id) + suffix

    def _read_extras(self, pipe: Any, key: str, client_id: str) -> None:
        extras = self.extras_key(client_id)
        if extras is None:
            pipe.lindex(key, -1)
        else:
            pipe.get(extras)

    def read(self, client_id: str) -> CounterState:
        """The client's state without changing it (pending 0 when it has none)."""
        key = self.key(client_id)
        with self._redis.pipeline(transaction=True) as pipe:
            getattr(pipe, self._layout.read)(key)
            pipe.pttl(key)
            self._read_extras(pipe, key, client_id)
            raw, ttl, extras = pipe.execute()
        return self._state(client_id, key, raw, ttl, extras) or CounterState(client_id, 0, key, None)

    def _state(self, client_id: str, key: str, raw: Any, ttl: int, extras: Any) -> CounterState | None:
        documents = self._layout.documents(raw)
        if documents is None:
            return None
        if self._layout.extras_suffix is None:
            in_list = sentinel_extras(extras)
            documents, extra = (documents, 0) if in_list is None else (documents - 1, in_list)
        else:
            extra = extras_value(extras)
        counted = max(0, documents * RESOLUTION + extra)
        # The last document was checked at minus the costs before it; its own cost is not kept,
        # so it is taken as 1, or as all that is counted when that is less: 1 - 0.3 made a
        # client with one document of cost 0.3 read as pending +0.7.
        last = min(RESOLUTION, counted)
        return CounterState(
            client_id, as_count(last - counted), key, ttl if ttl >= 0 else None, as_count(counted)
        )

    def clear(self, client_id: str) -> bool:
        """Forget one client; True when it had state."""
        tagged = client_key(self._prefix, client_id)
        # The companions share the client's hash tag, so its slot on a Cluster; they may outlive
        # the client's key (an order key after its list emptied), which alone says "had state".
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.key(client_id))
            for suffix in self._layout.companion_suffixes:
                pipe.delete(tagged + suffix)
            had, *_ = pipe.execute()
        return bool(had)

    def scan(self, count: int = 500) -> Iterator[CounterState]:
        """Every tracked client, read in batches of ``count``."""
        for batch in scanned(self._redis, self._pattern, count):
            yield from self._read_keys(batch)

    def clear_all(self, count: int = 500) -> int:
        """Forget every client on every master; returns how many keys were deleted."""
        # On Redis Cluster, redis-py splits ``unlink(*keys)`` into one UNLINK per hash slot,
        # so a batch whose keys live on several masters never sends a cross-slot command.
        patterns = (self._pattern, *self._companion_patterns)
        keys = (self._redis.scan_iter(match=p, count=count) for p in patterns)
        return sum(int(self._redis.unlink(*batch)) for batch in batched(itertools.chain(*keys), count))

    def _read_keys(self, keys: list[str]) -> Iterator[CounterState]:
        clients = [self._layout.client_of(self._prefix, key) for key in keys]
        with self._redis.pipeline(transaction=False) as pipe:
            for key, client_id in zip(keys, clients, strict=True):
                getattr(pipe, self._layout.read)(key)
                pipe.pttl(key)
                self._read_extras(pipe, key, client_id or "")
            replies = pipe.execute()
        for i, (key, client_id) in enumerate(zip(keys, clients, strict=True)):
            if client_id is None:
                continue
            state = self._state(client_id, key, *replies[3 * i : 3 * i + 3])
            if state is not None:
                yield state


def batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of ``size``, the last one shorter (``itertools.batched`` from 3.12)."""
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def scanned(client: redis.Redis, pattern: str, count: int) -> Iterator[list[str]]:
    """The keys matching ``pattern``, as text, in SCAN batches of ``count``."""
    keys = client.scan_iter(match=pattern, count=count)
    return batched((key.decode() if isinstance(key, bytes) else key for key in keys), count)
