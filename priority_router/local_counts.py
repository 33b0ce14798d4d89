"""A publishing process's own count of each client's recent documents: what prices a
publish while the counter store does not answer (``engine.py``), so that a giant's burst
still sinks and light clients stay urgent through an outage.

Each publish the store counted leaves here the count its client's next document would be
checked at (the store's count, as that publish read it) and the client's own tier.  While
the store fails, each publish of the client goes on from there by the scheme's rules
(SPEC.md): from 0 when the client has no count here or published nothing for
``reset_interval`` seconds, else one cost below the last.  Nothing here is written back
to the store: when it answers, its counts go on from what it held, and each publish the
store counts replaces the client's count here.

A process sees only its own publishes: with several publishers, each prices a client by
its own share of the client's documents during an outage.  At most ``MAX_CLIENTS``
clients are kept, the one that published least recently dropped first (about 200 bytes
each).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .forks import renew_after_fork
from .tiers import Tier

#: The most clients one process keeps a count for.
MAX_CLIENTS = 10_000

#: A client's entry: the count its next document is checked at, when it was last written
#: (monotonic seconds), and its own tier (None: it has none, or none was read).
Entry = tuple[int | float, float, Tier | None]


class LocalCounts:
    """Per-client counts of one process, kept for ``reset_interval`` seconds."""

    def __init__(
        self, reset_interval: float, limit: int = MAX_CLIENTS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._reset_interval = reset_interval
        self._limit = limit
        self._clock = clock
        self._entries: dict[str, Entry] = {}
        self._lock = threading.Lock()
        renew_after_fork(self)

    def after_fork(self) -> None:
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def counted(self, client_id: str, following: int | float, tier: Tier | None) -> None:
        """The store counted the client's document: its next is checked at ``following``."""
        entry = (following, self._clock(), tier)
        with self._lock:
            self._put(client_id, entry)

    def count(self, client_id: str, cost: int | float, n: int = 1) -> tuple[list[int | float], Tier | None]:
        """``n`` documents of the client, each of ``cost``, counted here: the count each is
        checked at, and the client's own tier as the store last gave it."""
        now = self._clock()
        with self._lock:
            entry = self._entries.get(client_id)
            following: int | float = 0
            tier = None
            if entry is not None:
                tier = entry[2]
                if now - entry[1] <= self._reset_interval:
                    following = entry[0]
            self._put(client_id, (following - n * cost, now, tier))
        return [following - i * cost for i in range(n)], tier

    def _put(self, client_id: str, entry: Entry) -> None:
        """Under the lock."""
        entries = self._entries
        # Removed and added again: the dict's order is then the order of last use.
        entries.pop(client_id, None)
        entries[client_id] = entry
        if len(entries) > self._limit:
            del entries[next(iter(entries))]
