"""The workers' gate in the simulator: per-client caps, borrowing and rates (``limits.py``).

A free slot takes the next document the queue discipline gives; the gate then admits it
(it runs on that slot) or holds it: the document leaves the queue without taking the slot,
in no time, and waits in its client's held list, in arrival order, outside the queue.  A
client's document is held when

- the client's running count (documents running, and released ones not yet started) is at
  its ``max_in_flight``;
- the cost running plus the document's own would pass ``max_cost_in_flight``, unless the
  client runs nothing (a document larger than the cap runs alone);
- its token bucket (``rate``, holding up to ``Limits.bucket`` tokens, full at the start,
  one token per start) has less than one token that no released document has reserved;
- or the client already has held documents: a newcomer waits behind them.

Held documents are released in order while the limits allow: at once when one of the
client's documents ends, and at the gate's next tick (every ``tick`` seconds from 0, as the
worker's sweep runs) when a token falls due.  A released document counts as running from
its release (a reservation, which reserves its token) and goes back to the queue with the
priority it was published with; the slot that takes it runs it without a new check, and
spends the token then, so released documents that come back together start no faster than
the bucket allows.

Borrowing (``borrow``): at a tick with free slots and nothing queued, held documents of
borrowing clients are released beyond their caps, at most one per free slot, oldest first
and round robin over clients; and when a borrowing client's document ends while the queue
is empty, after the releases its limits allow, one more is released beyond the caps, as
the real gate's end does (``store/lua/gate.lua``): with a ``max_in_flight``, only when the
client ran beyond it, so a borrowed document is replaced, not added.  A borrowed document
is never preempted.  A rate is not a cap: a borrowed release needs and takes a token like
any other.

The limits hold for the whole replay: a change mid-trace is not modelled.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ..limits import Limits
from .costs import ONE, RESOLUTION
from .trace import Trace

#: Seconds between the gate's ticks unless told: the worker's sweep.
GATE_TICK = 0.25
#: A bucket short of a token by less than this holds one: rate x seconds sums in floats.
EPSILON = 1e-9


@dataclass(frozen=True)
class GateStats:
    """What the gate did to one client with limits."""

    #: Most documents running at once, released ones not yet started included.
    peak: int
    #: Documents held at least once.
    held: int
    #: Seconds its documents spent held, in all.
    held_seconds: float


class Gate:
    """Every client's limits and what its documents are doing, for one replay of ``trace``;
    ``limits`` has one entry per client index (``Limits()`` for none)."""

    def __init__(self, trace: Trace, limits: Sequence[Limits], tick: float = GATE_TICK) -> None:
        if len(limits) != len(trace.clients):
            raise ValueError("limits must have one entry per client")
        if not (0 < tick < math.inf):
            raise ValueError(f"tick {tick!r} must be a positive number of seconds")
        self.tick = tick
        self._limited = [bool(lim) for lim in limits]
        self._cap = [math.inf if lim.max_in_flight is None else lim.max_in_flight for lim in limits]
        self._cost_cap = [
            math.inf if lim.max_cost_in_flight is None else round(lim.max_cost_in_flight * RESOLUTION)
            for lim in limits
        ]
        self._rate = [lim.per_second or 0.0 for lim in limits]
        self._bucket = [float(lim.bucket or 0) for lim in limits]
        self._borrow = [lim.borrow for lim in limits]
        self._tokens = list(self._bucket)
        #: Tokens reserved by released documents not started yet.
        self._promised = [0] * len(limits)
        self._stamp = [0.0] * len(limits)
        self._running = [0] * len(limits)
        self._cost = [0] * len(limits)
        self._peak = [0] * len(limits)
        self._held: list[deque[int]] = [deque() for _ in limits]
        self._held_count = [0] * len(limits)
        self._held_seconds = [0.0] * len(limits)
        self._held_at: dict[int, float] = {}
        self._units = trace.cost_units
        self._reserved = bytearray(len(trace))
        #: Clients with held documents that a tick may release (they have a rate or borrow).
        self._ticking: dict[int, None] = {}
        self._next_tick = 0

    @property
    def ticking(self) -> bool:
        """Whether the next tick may release something."""
        return bool(self._ticking)

    @property
    def next_tick(self) -> float:
        return self._next_tick * self.tick

    def ticked(self) -> None:
        self._next_tick += 1

    def admit(self, doc: int, client: int, now: float) -> bool:
        """A slot took ``doc``: True when it runs, False when it is held."""
        if not self._limited[client]:
            return True
        if self._reserved[doc]:
            self._reserved[doc] = 0
            if self._rate[client]:
                self._refill(client, now)
                self._promised[client] -= 1
                self._tokens[client] -= 1
            return True
        if self._held[client] or not self._allows(client, doc, now):
            self._hold(doc, client, now)
            return False
        self._charge(doc, client)
        return True

    def ended(self, doc: int, client: int, now: float, queued: int) -> list[int]:
        """``doc`` ended with ``queued`` documents in the queue: the documents it releases."""
        if not self._limited[client]:
            return []
        cap = self._cap[client]
        lends = self._borrow[client] and not queued and (cap == math.inf or self._running[client] > cap)
        self._running[client] -= 1
        self._cost[client] -= self._units[doc] if self._units else ONE
        released: list[int] = []
        self._release_allowed(client, now, released)
        if lends and self._held[client] and self._has_token(client, now):
            released.append(self._release(client, now))
        return released

    def due(self, now: float) -> list[int]:
        """At a tick: the held documents the limits now allow (their tokens fell due)."""
        released: list[int] = []
        for client in list(self._ticking):
            self._release_allowed(client, now, released)
        return released

    def lend(self, now: float, slots: int) -> list[int]:
        """At a tick with ``slots`` free and nothing queued: held documents of borrowing
        clients released beyond their caps, at most ``slots``, oldest first, round robin."""
        lenders = sorted((self._held_at[self._held[c][0]], c) for c in self._ticking if self._borrow[c])
        turns = deque(c for _, c in lenders)
        released: list[int] = []
        while turns and len(released) < slots:
            client = turns.popleft()
            if self._has_token(client, now):
                released.append(self._release(client, now))
                if self._held[client]:
                    turns.append(client)
        return released

    def stats(self) -> dict[int, GateStats]:
        """Client index -> what the gate did to it, for every client with limits."""
        return {
            c: GateStats(self._peak[c], self._held_count[c], self._held_seconds[c])
            for c, limited in enumerate(self._limited)
            if limited
        }

    def _allows(self, client: int, doc: int, now: float) -> bool:
        running = self._running[client]
        if running >= self._cap[client]:
            return False
        units = self._units[doc] if self._units else ONE
        if running and self._cost[client] + units > self._cost_cap[client]:
            return False
        return self._has_token(client, now)

    def _has_token(self, client: int, now: float) -> bool:
        if not self._rate[client]:
            return True
        return self._refill(client, now) - self._promised[client] >= 1 - EPSILON

    def _refill(self, client: int, now: float) -> float:
        rate = self._rate[client]
        tokens = min(self._bucket[client], self._tokens[client] + rate * (now - self._stamp[client]))
        self._tokens[client] = tokens
        self._stamp[client] = now
        return tokens

    def _charge(self, doc: int, client: int, release: bool = False) -> None:
        """``doc`` runs, or is released to run: it counts, and takes its token (refilled
        to ``now`` by the check that allowed it), or reserves it when ``release``."""
        running = self._running[client] = self._running[client] + 1
        if running > self._peak[client]:
            self._peak[client] = running
        self._cost[client] += self._units[doc] if self._units else ONE
        if self._rate[client] and release:
            self._promised[client] += 1
        elif self._rate[client]:
            self._tokens[client] -= 1

    def _hold(self, doc: int, client: int, now: float) -> None:
        held = self._held[client]
        held.append(doc)
        self._held_at[doc] = now
        self._held_count[client] += 1
        if len(held) == 1 and (self._rate[client] or self._borrow[client]):
            if not self._ticking:
                # The worker's sweep runs on a grid from 0; the first one after the hold.
                self._next_tick = math.floor(now / self.tick) + 1
            self._ticking[client] = None

    def _release(self, client: int, now: float) -> int:
        held = self._held[client]
        doc = held.popleft()
        if not held:
            self._ticking.pop(client, None)
        self._charge(doc, client, release=True)
        self._reserved[doc] = 1
        self._held_seconds[client] += now - self._held_at.pop(doc)
        return doc

    def _release_allowed(self, client: int, now: float, released: list[int]) -> None:
        held = self._held[client]
        while held and self._allows(client, held[0], now):
            released.append(self._release(client, now))
