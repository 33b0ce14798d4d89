"""The per-client pending counter in Redis.

One string key per active client holds how many documents it submitted in the
current busy spell (``n``); ``pending = 1 - n``, so the first document of a spell
is checked at 0.  The key's TTL is the reset: every check re-arms it to
``reset_interval``, so after more than ``reset_interval`` idle seconds Redis (on its
own clock) has dropped the key and the next check starts a new spell.  Memory is
bounded by active clients.

A check is ``MULTI; INCR key; PEXPIRE key ms; EXEC``: atomic, so concurrent
publishers on many hosts lose no update, and no key is ever left without expiry.
Two native commands in a transaction serve more checks per second than the
equivalent Lua script (``bench/store.py throughput``; docs/performance.md); on the
client the transaction is sent pre-packed (``packed.py``), one round trip.  A batch of ``n``
documents is one check with ``INCRBY key n``.  Once tiers are in use, the same
transaction also reads the client's tier (``GET``; its key shares the client's hash tag).
"""

from __future__ import annotations

from typing import Any

import redis

from .client_ids import TIER_SUFFIX, client_id_from_key, client_key
from .client_keys import ClientKeys, CounterState, Layout
from .costs import ONE, pending_before
from .packed import Extras, PackedCheck, exchange_for, pipelined_add

#: Ends the key of a client's extras in the seed mode (``costs.py``).
EXTRAS_SUFFIX = ":c"

__all__ = ["SEED", "Counter", "CounterState"]

#: One string per client: the documents it submitted in the spell.
SEED = Layout(
    key=client_key,
    client_of=client_id_from_key,
    suffix="",
    read="get",
    documents=lambda value: None if value is None else int(value),
    extras_suffix=EXTRAS_SUFFIX,
    companion_suffixes=(EXTRAS_SUFFIX,),
)


class Counter(ClientKeys):
    """Atomic per-client checks on one Redis (or Redis Cluster) connection."""

    def __init__(self, client: redis.Redis, prefix: str, reset_interval: float) -> None:
        super().__init__(client, prefix, reset_interval, SEED)
        exchange = exchange_for(client)
        ms = self._interval_ms
        self._add = PackedCheck(exchange, ms).add if exchange else pipelined_add(client, ms)
        self._add_tier = (
            PackedCheck(exchange, ms, _tier_of_counter).add
            if exchange
            else pipelined_add(client, ms, _tier_of_counter)
        )

    def record(self, client_id: str) -> int:
        """One counted submission of cost 1 (docs/scheme.md, "One check"); the new pending count."""
        return 1 - self._add(client_key(self._prefix, client_id), 1)[0]

    def count(
        self, client_id: str, n: int = 1, units: int = ONE, tier: bool = False, costs: bool = False
    ) -> tuple[list[int | float], Any]:
        """``n`` counted submissions of ``units`` each in one round trip: the pending count
        each is checked at (minus the costs before it in the spell), in order, and the
        client's stored tier when ``tier`` (read in the same transaction).  ``costs`` (any
        costed document counted under the prefix) reads the client's extras too."""
        if n < 1:
            return [], None
        key = client_key(self._prefix, client_id)
        extra = (units - ONE) * n
        extras = Extras(key + EXTRAS_SUFFIX, extra) if costs or extra else None
        submitted, stored, total = (self._add_tier if tier else self._add)(key, n, extras)
        first, before = submitted - n, total - extra
        each = units - ONE
        return [pending_before(first + i, before + i * each) for i in range(n)], stored


def _tier_of_counter(key: str) -> str:
    return key + TIER_SUFFIX
