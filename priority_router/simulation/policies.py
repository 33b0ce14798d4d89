"""Queue disciplines: which waiting document a free worker slot takes next.

- ``fifo``: plain Celery, one queue, first in first out.
- ``seed`` / ``inflight``: the router.  At publish the client's count (``counters.py``,
  each document counted by its cost: ``costs.py``) gives ``pending``, the router's
  threshold table gives the logical priority, and the document joins that priority's list;
  a free slot takes the oldest document of the most urgent non-empty list (kombu's Redis
  transport with the router's settings: one list per priority step, polled in priority
  order).
- ``+max_wait``: the worker's sweeper runs every ``sweep_interval(max_wait)`` seconds
  and moves every document published ``max_wait`` or more seconds ago (at most
  ``BATCH * MAX_CALLS`` per sweep), oldest first, to step 0, the list polled before every
  priority (``integration/lua/promote.lua``).
- ``rr``: round robin over clients, one document per client per turn: the ideal of
  counting documents.
- ``drr``: deficit round robin over clients, the ideal of counting costs: each client with
  waiting documents gets ``quantum`` of cost per round, by the documents' costs, or by
  their seconds when every document costs 1 (by a cost of 1 it would be ``rr``).

Both ideals are what no broker offers.

Tiers (``tiers.py``) adjust the router's priorities (seed and inflight, with or without
max_wait); ``fifo``, ``rr`` and ``drr`` have no priorities and ignore them.  Their limits
apply under every discipline: the gate (``gate.py``) is at the workers, and a document it
releases comes back through :meth:`Discipline.requeue`.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections import defaultdict, deque
from collections.abc import Callable, Sequence

from ..config import RouterConfig
from ..integration.starvation import BATCH, MAX_CALLS, sweep_interval
from ..thresholds import LEAST_URGENT, Policy
from .costs import ONE, RESOLUTION, as_count, whole
from .counters import InflightCount, SeedCount
from .tiers import Tiers
from .trace import Trace

#: Every policy ``simulate`` knows, in the order it reports them.
EVERY_POLICY = ("fifo", "seed", "seed+max_wait", "inflight", "inflight+max_wait", "rr", "drr")
#: The policies ``simulate`` compares unless told, as before costs: all but ``rr``, which
#: the command adds when documents have costs.
POLICIES = tuple(p for p in EVERY_POLICY if p != "rr")
#: Most documents one sweep promotes (a sweep calls the script up to MAX_CALLS times).
SWEEP_LIMIT = BATCH * MAX_CALLS

#: ``prioritize(client_id, pending)`` -> logical priority 1..9, for a count that may be
#: fractional (costs).  The router's is its threshold table's ``priority_for(pending)``;
#: with tiers, ``Tiers.prioritize`` (the client's tier, else the default tier, else the table).
Prioritize = Callable[[str, float], int]


class Discipline(ABC):
    """One queue discipline, driven by :func:`~priority_router.simulation.engine.run`.

    By default it has no sweeps, nothing to do when a document finishes, and a released
    document waits again as a fresh publish would: the disciplines without priorities."""

    #: Seconds between sweeps of waiting documents, None for none.
    sweep_every: float | None = None

    @abstractmethod
    def prepare(self, trace: Trace, published: list[float]) -> None:
        """Start afresh for ``trace``; ``published[doc]`` is each published document's time."""

    @abstractmethod
    def publish(self, doc: int, client: int, now: float) -> None:
        """``doc`` of ``client`` is published at ``now`` and waits."""

    def requeue(self, doc: int, client: int, now: float) -> None:
        """``doc``, held by the gate and now released, waits again where its publish put it
        (the priority it was published with), without being counted again."""
        self.publish(doc, client, now)

    @abstractmethod
    def take(self) -> int:
        """The waiting document a free slot takes next (there is one)."""

    def finish(self, doc: int, client: int, now: float) -> None:
        """``doc`` of ``client`` finished at ``now``."""
        return None

    def sweep(self, now: float) -> None:
        """A sweep at ``now`` (only when ``sweep_every`` is set)."""
        return None


class Fifo(Discipline):
    """Plain Celery: one queue, first in first out."""

    def prepare(self, trace: Trace, published: list[float]) -> None:
        self._queue: deque[int] = deque()

    def publish(self, doc: int, client: int, now: float) -> None:
        self._queue.append(doc)

    def take(self) -> int:
        return self._queue.popleft()


class RouterQueue(Discipline):
    """The router in ``mode`` ("seed" or "inflight"), with the max_wait sweeper when
    ``max_wait`` is set."""

    def __init__(
        self,
        mode: str,
        thresholds: Policy,
        reset_interval: float,
        max_wait: float | None = None,
        prioritize: Prioritize | None = None,
    ) -> None:
        if mode not in ("seed", "inflight"):
            raise ValueError(f"mode {mode!r} is not seed or inflight")
        self.mode = mode
        self.thresholds = thresholds
        self.reset_interval = reset_interval
        self.max_wait = max_wait
        self.prioritize = prioritize
        self.sweep_every = None if max_wait is None else sweep_interval(max_wait)

    def prepare(self, trace: Trace, published: list[float]) -> None:
        #: Index 0 is step 0 (promoted documents); 1..9 are the logical priorities.
        self._lists: list[deque[int]] = [deque() for _ in range(LEAST_URGENT + 1)]
        self._published = published
        self._units = trace.cost_units
        # Without costs the counts are in documents, as the router's were before costs.
        one = ONE if self._units else 1
        self._seed = SeedCount(self.reset_interval, one)
        self._inflight = InflightCount(self.reset_interval, one)
        self._ids = trace.clients
        #: Each published document's priority, for requeue.
        self._levels = [0] * len(trace)

    def publish(self, doc: int, client: int, now: float) -> None:
        units = self._units[doc] if self._units else 1
        if self.mode == "seed":
            pending = self._seed.record(client, now, units)
        else:
            pending = self._inflight.record(client, doc, now, units)
        if self.prioritize is None:
            priority = self.thresholds.priority_for(whole(pending) if self._units else pending)
        else:
            priority = self.prioritize(self._ids[client], as_count(pending) if self._units else pending)
        self._levels[doc] = priority
        self._lists[priority].append(doc)

    def requeue(self, doc: int, client: int, now: float) -> None:
        self._lists[self._levels[doc]].append(doc)

    def take(self) -> int:
        for waiting in self._lists:
            if waiting:
                return waiting.popleft()
        raise IndexError("take() from an empty queue")

    def finish(self, doc: int, client: int, now: float) -> None:
        if self.mode == "inflight":
            self._inflight.end(client, doc, now, self._units[doc] if self._units else 1)

    def sweep(self, now: float) -> None:
        """promote.lua: while the oldest document of the priority lists was published at
        or before ``now - max_wait``, move it to the tail of step 0."""
        assert self.max_wait is not None
        cutoff = now - self.max_wait
        published = self._published
        lists = self._lists
        heads = [(published[q[0]], p) for p, q in enumerate(lists) if p and q and published[q[0]] <= cutoff]
        if not heads:
            return
        heapq.heapify(heads)
        promoted = lists[0]
        for _ in range(SWEEP_LIMIT):
            if not heads:
                break
            _, p = heads[0]
            waiting = lists[p]
            promoted.append(waiting.popleft())
            if waiting and published[waiting[0]] <= cutoff:
                heapq.heapreplace(heads, (published[waiting[0]], p))
            else:
                heapq.heappop(heads)


class RoundRobin(Discipline):
    """Round robin over clients: one document per client per turn, whatever it costs.

    Clients with waiting documents take turns in the order they became busy; a turn serves
    the client's oldest document, and a client with more waiting then goes to the back
    (at the next take, as in :class:`DeficitRoundRobin`, so a client that became busy
    meanwhile goes before it).
    """

    def prepare(self, trace: Trace, published: list[float]) -> None:
        self._queues: defaultdict[int, deque[int]] = defaultdict(deque)
        self._active: deque[int] = deque()
        self._turn = False

    def publish(self, doc: int, client: int, now: float) -> None:
        waiting = self._queues[client]
        if not waiting:
            self._active.append(client)
        waiting.append(doc)

    def take(self) -> int:
        active = self._active
        if self._turn:
            active.rotate(-1)
        waiting = self._queues[active[0]]
        doc = waiting.popleft()
        self._turn = bool(waiting)
        if not waiting:
            active.popleft()
        return doc


class DeficitRoundRobin(RoundRobin):
    """Deficit round robin over clients (Shreedhar and Varghese, 1996) by the documents'
    costs, or by their seconds when every document costs 1: by a cost of 1 it would be
    :class:`RoundRobin`, and seconds of work are what it always shared.

    Clients with waiting documents take turns in the order they became busy; a turn adds
    ``quantum`` to the client's deficit and serves its documents, oldest first, while the
    next one fits in the deficit.  A client that runs out of documents leaves the round and
    loses its deficit.  The default quantum is the trace's largest cost (longest document),
    so every turn serves at least one document (the classic choice: work per document
    stays constant however many clients wait).
    """

    def __init__(self, quantum: float | None = None) -> None:
        if quantum is not None and not quantum > 0:
            raise ValueError(f"quantum {quantum!r} is not a positive number of seconds or cost")
        self.quantum = quantum

    def prepare(self, trace: Trace, published: list[float]) -> None:
        super().prepare(trace, published)
        # A client's deficit is 0 when it joins the round, as it was left when it last left.
        self._deficit: defaultdict[int, float] = defaultdict(float)
        # The deficits count in the costs' units, so a quantum given as a cost is scaled to them.
        self._cost: Sequence[float] = trace.cost_units or trace.duration
        scale = RESOLUTION if trace.cost_units else 1
        self._q = self.quantum * scale if self.quantum is not None else max(self._cost)

    def take(self) -> int:
        active = self._active
        deficit = self._deficit
        while True:
            client = active[0]
            if not self._turn:
                deficit[client] += self._q
                self._turn = True
            waiting = self._queues[client]
            cost = self._cost[waiting[0]]
            if cost <= deficit[client]:
                deficit[client] -= cost
                doc = waiting.popleft()
                if not waiting:
                    active.popleft()
                    deficit[client] = 0.0
                    self._turn = False
                return doc
            active.rotate(-1)
            self._turn = False


def build(
    name: str, config: RouterConfig, quantum: float | None = None, tiers: Tiers | None = None
) -> Discipline:
    """The discipline called ``name`` (one of :data:`EVERY_POLICY`) with ``config``'s
    thresholds, reset interval and max_wait, and ``tiers`` for the router's policies."""
    if name == "fifo":
        return Fifo()
    if name == "drr":
        return DeficitRoundRobin(quantum)
    if name == "rr":
        return RoundRobin()
    mode, _, bounded = name.partition("+")
    if mode not in ("seed", "inflight") or bounded not in ("", "max_wait"):
        raise ValueError(f"{name!r} is not a policy; use one of {', '.join(EVERY_POLICY)}")
    if bounded and config.max_wait is None:
        raise ValueError(f"{name} needs a max_wait; set max_wait in the configuration")
    return RouterQueue(
        mode,
        config.thresholds,
        config.reset_interval,
        config.max_wait if bounded else None,
        None if tiers is None else tiers.prioritize(config.thresholds),
    )
