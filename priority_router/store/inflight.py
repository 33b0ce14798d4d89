"""The per-client in-flight list in Redis (``mode="inflight"``).

One Redis list per active client holds the documents published and not yet finished;
``pending = 1 - LLEN`` at a publish (the first document with nothing in flight is
checked at 0, as in the seed mode), and ``pending = 0`` when the list is gone.

- A counted publish is one script, ``publish_inflight.lua``: ``LPUSH`` the document,
  re-arm the TTL, and read the count it is checked at, never less than what the client's
  newest document still in flight was checked at (the order key ``<prefix>{token}:o``),
  so a client's documents keep their order when its count falls.  Its ``EVALSHA`` is
  sent pre-packed (``packed.py``), one round trip as a seed publish is.
- The end of a document is ``MULTI; LREM key -1 m; PEXPIRE key ms; EXEC`` on the
  worker (``end_costed.lua`` once costs are in use, or when ``m`` is not there: the task
  id's digest is the key, so a document counted at another cost than its end expects is
  ended all the same, at the cost it was counted with).  ``LREM`` removes one entry, so
  each counted publish is ended at most once: duplicate end events, redeliveries and ends
  of documents that were never added change nothing, and the count never rises above
  "nothing in flight".  A task id published twice is two messages, counted and ended once
  each.  Redis deletes a list whose last entry goes.
- ``-1`` searches from the oldest entry and walks past every older document of the
  client still in flight.  On one queue a client's documents finish in about the order
  they were published (at one priority a queue is first in, first out), so the entry is
  among the first looked at; newer documents that finish before a deep backlog of older
  ones pay for the backlog, and an end that finds nothing reads the whole list
  (``bench/store.py end``).
- Once tiers are in use, the publish's script also reads the client's tier (its key
  shares the client's hash tag, as the order key does).
- The TTL stays the idle reset, as a safety net for ends lost to crashes: every publish
  and every end re-arms it, so a list is dropped only after ``reset_interval`` seconds
  without either.
- A document counted by a Celery publish is counted *unconfirmed* (``provisional``): its
  entry also goes in the client's sorted set ``<prefix>{token}:u`` with a deadline
  :data:`UNCONFIRMED_WINDOW` on.  Once the broker took the message, its publisher confirms
  it (:meth:`InflightCounter.confirm`: ``ZREM``, batched in the background, so the publish
  stays one round trip).  A publisher killed between its count and its send never
  confirms: the client's next publish drops the entries whose deadline passed, since no
  worker will ever end them and each publish would re-arm the idle reset that clears them.

The entry ``m`` is the 8-byte BLAKE2b digest of the task id: a list keeps it in 10
bytes (a UUID's 36 characters would take 38), and hashing costs the publisher little
beside the round trip (docs/performance.md).
Two in-flight documents of one client share an entry with probability about
k**2 / 2**65 for k documents in flight (3e-14 for a thousand), and even then each end
removes one of them.
"""

from __future__ import annotations

import struct
from hashlib import blake2b as _blake2b
from pathlib import Path
from typing import Any

import redis

from .client_ids import (
    INFLIGHT_SUFFIX,
    ORDER_SUFFIX,
    TIER_SUFFIX,
    UNCONFIRMED_SUFFIX,
    client_id_from_inflight_key,
    inflight_key,
)
from .client_keys import ClientKeys, Layout
from .costs import ONE, RESOLUTION, SENTINEL, as_count
from .packed import CACHE_SIZE, EXEC, MULTI, Exchange, bulk, call, command, exchange_for, transact
from .permissions import register_script


def member(task_id: str, extra: int = 0) -> bytes:
    """The list entry that stands for ``task_id``: its 8-byte BLAKE2b digest, and for a
    costed document the units its cost adds beyond 1 (4 bytes, signed), so that its end,
    which knows the cost from the message's headers, removes exactly its entry."""
    try:
        raw = task_id.encode()
    except UnicodeEncodeError:  # a lone surrogate: still one stable entry per id
        raw = task_id.encode("utf-8", "surrogateescape")
    digest = _blake2b(raw, digest_size=8).digest()
    return digest + _EXTRA.pack(extra) if extra else digest


_EXTRA = struct.Struct(">i")
_LUA = Path(__file__).parent / "lua"

#: Seconds a document counted by a publish stays counted without its publisher confirming
#: that the broker took it: far longer than a send takes, and than the publisher's
#: background confirms wait (``engine.CONFIRM_EVERY``).
UNCONFIRMED_WINDOW = 50.0

#: One list per client: the documents published and not finished (and, once costed
#: documents were published, the client's extras as its oldest entry: ``costs.py``).
INFLIGHT = Layout(
    key=inflight_key,
    client_of=client_id_from_inflight_key,
    suffix=INFLIGHT_SUFFIX,
    read="llen",
    documents=lambda value: int(value) if value else None,
    extras_suffix=None,
    companion_suffixes=(ORDER_SUFFIX, UNCONFIRMED_SUFFIX),
)


class InflightCounter(ClientKeys):
    """Atomic per-client publishes and ends on one Redis (or Redis Cluster) connection."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        reset_interval: float,
        unconfirmed_window: float = UNCONFIRMED_WINDOW,
    ) -> None:
        super().__init__(client, prefix, reset_interval, INFLIGHT)
        self._expiry = str(self._interval_ms).encode()
        self._window = b"%d" % max(1, round(unconfirmed_window * 1000))
        self._exchange = exchange_for(client)
        self._publish: Any = register_script(client, (_LUA / "publish_inflight.lua").read_text())
        self._end_costed: Any = register_script(client, (_LUA / "end_costed.lua").read_text())
        #: Per key: the packed ``EVALSHA`` up to the document's entry (its keys).
        self._heads: dict[str, bytes] = {}
        #: Per (tier read, extras read, provisional): the packed arguments after the entry,
        #: for cost 1.
        self._tails: dict[tuple[bool, bool, bool], bytes] = {}

    def record(self, client_id: str, task_id: str) -> int:
        """One counted publish of document ``task_id`` of cost 1; returns the new pending count."""
        pending, _ = self.count(client_id, task_id)
        return int(pending)

    def count(
        self,
        client_id: str,
        task_id: str,
        units: int = ONE,
        tier: bool = False,
        costs: bool = False,
        provisional: bool = False,
    ) -> tuple[int | float, Any]:
        """One counted publish of document ``task_id`` costing ``units``: the pending count it
        is checked at (minus the costs in flight before it, or minus what the client's newest
        document in flight was checked at, whichever is lower), and the client's stored tier
        when ``tier``.  ``costs`` (any costed document counted under the prefix) reads the
        extras.  A ``provisional`` document stops counting after :data:`UNCONFIRMED_WINDOW`
        unless :meth:`confirm` is told its broker took it."""
        key = inflight_key(self._prefix, client_id)
        extra = units - ONE
        entry = member(task_id, extra)
        if self._exchange:
            before, stored = self._packed_publish(self._exchange, key, entry, extra, tier, costs, provisional)
        else:
            keys = [key, _tier_of_list(key), _order_of_list(key), _unconfirmed_of_list(key)]
            window = self._window if provisional else b"0"
            args = [entry, extra, self._expiry, _FLAG[tier], _FLAG[costs], SENTINEL, RESOLUTION, window]
            before, stored = self._publish(keys=keys, args=args)
        return as_count(-int(before)), stored if tier else None

    def confirm(self, documents: list[tuple[str, str, int]]) -> None:
        """The broker took these provisionally counted documents (client, task id, units):
        they count until they end.  One round trip per master; confirming a document already
        ended, or dropped as unconfirmed, changes nothing."""
        with self._redis.pipeline(transaction=False) as pipe:
            for client_id, task_id, units in documents:
                key = _unconfirmed_of_list(inflight_key(self._prefix, client_id))
                pipe.zrem(key, member(task_id, units - ONE))
            pipe.execute()

    def end(self, client_id: str, task_id: str, units: int | None = None, costs: bool = False) -> int | None:
        """The end of document ``task_id``: the units it was counted with when this call
        ended it (at most once), None when it was not in flight.  ``units`` is the cost the
        end expects, a check and a hint, not a key: a document counted at another cost is
        ended all the same, at the cost it was counted with.  With ``costs``, its extras go
        back with it, once."""
        key = inflight_key(self._prefix, client_id)
        expected = ONE if units is None else units
        m = member(task_id, expected - ONE)
        if not (costs or expected != ONE):
            if self._exchange:
                # Packed like the publish: on a worker this runs once per document.
                raw = key.encode()
                packed = (
                    MULTI + command(b"LREM", raw, b"-1", m) + command(b"PEXPIRE", raw, self._expiry) + EXEC
                )
                removed = transact(self._exchange, raw, packed, 2)[0]
            else:
                with self._redis.pipeline(transaction=True) as pipe:
                    pipe.lrem(key, -1, m)  # type: ignore[arg-type]  # redis-py sends bytes as they are
                    pipe.pexpire(key, self._interval_ms)
                    removed, _ = pipe.execute()
            if removed:
                return ONE
            # Not there at cost 1: perhaps counted with a cost this process has not seen used
            # yet (the marker is read every few seconds), or never counted at all.
        args = [m, expected - ONE, self._interval_ms, SENTINEL]
        removed, extra = self._end_costed(keys=[key], args=args)
        return ONE + int(extra) if removed else None

    def _packed_publish(
        self,
        exchange: Exchange,
        key: str,
        entry: bytes,
        extra: int,
        tier: bool,
        costs: bool,
        provisional: bool,
    ) -> Any:
        head = self._heads.get(key)
        if head is None:
            keys = (
                key.encode(),
                _tier_of_list(key).encode(),
                _order_of_list(key).encode(),
                _unconfirmed_of_list(key).encode(),
            )
            head = b"*15\r\n" + b"".join(
                bulk(p) for p in (b"EVALSHA", self._publish.sha.encode(), b"4", *keys)
            )
            if len(self._heads) >= CACHE_SIZE:
                self._heads.clear()
            self._heads[key] = head
        tail = self._tails.get((tier, costs, provisional)) if not extra else None
        if tail is None:
            tail = b"".join(
                bulk(a) for a in (b"%d" % extra, self._expiry, _FLAG[tier], _FLAG[costs], SENTINEL)
            )
            tail += bulk(b"%d" % RESOLUTION) + bulk(self._window if provisional else b"0")
            if not extra:
                self._tails[tier, costs, provisional] = tail
        packed = head + bulk(entry) + tail
        raw = key.encode()
        try:
            return call(exchange, raw, packed)
        except redis.exceptions.NoScriptError:
            # A restarted or flushed Redis (on a cluster, SCRIPT LOAD goes to every master).
            self._redis.script_load(self._publish.script)
            return call(exchange, raw, packed)


_FLAG = (b"0", b"1")


def _order_of_list(key: str) -> str:
    return key[: -len(INFLIGHT_SUFFIX)] + ORDER_SUFFIX


def _unconfirmed_of_list(key: str) -> str:
    return key[: -len(INFLIGHT_SUFFIX)] + UNCONFIRMED_SUFFIX


def _tier_of_list(key: str) -> str:
    return key[: -len(INFLIGHT_SUFFIX)] + TIER_SUFFIX
