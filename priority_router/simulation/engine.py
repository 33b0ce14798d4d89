"""The discrete-event loop: documents are published, wait, and run on ``workers`` slots.

The model (docs/simulate.md says why each part is what matters for fidelity):

- ``workers`` identical slots.  A slot that is free takes the next document the queue
  discipline gives, at once: the router's recommended settings (``worker_prefetch_multiplier=1``,
  ``task_acks_late=True``) make a worker fetch a new message only when one of its running
  documents is acknowledged, so nothing is reserved ahead of a free slot.  Plain Celery
  reserves messages ahead, but in one first-in-first-out queue that changes no order.
- A document holds its slot for its duration.  Publishing takes no time; fetching,
  acknowledging and handing a document to a slot take ``overhead`` seconds, during
  which the slot is taken and the document not yet started (0 by default; a real
  worker spends more with the router's prefetch of 1 than with plain Celery's, as
  ``bench/fairness.py --simulate`` measures: docs/simulate.md).
- Events at one instant happen in this order: the max_wait sweep, then documents
  finishing (the freed slot takes its next document at once), then publishes, in trace
  order.
- Sweeps run every ``sweep_every`` seconds from the first publish, as a worker's sweeper
  thread does from its start; sweeps while nothing waits are skipped, as they move
  nothing.
- With per-client limits, the workers' gate (``gate.py``) admits or holds each document a
  slot takes, and its ticks release held documents; at one instant a tick comes after the
  documents finishing and before the publishes.  A replay without limits runs the loop it
  ran before limits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from heapq import heappop, heappush

from ..limits import Limits
from .gate import GATE_TICK, Gate, GateStats
from .policies import Discipline
from .trace import Trace


@dataclass(frozen=True)
class Schedule:
    """When each document was published, started and finished (seconds, trace time)."""

    published: list[float]
    started: list[float]
    finished: list[float]
    #: Client index -> what the gate did to it, for each client with limits.
    gated: dict[int, GateStats] = field(default_factory=dict)


def run(
    trace: Trace,
    discipline: Discipline,
    workers: int,
    overhead: float = 0.0,
    limits: Sequence[Limits] | None = None,
    gate_tick: float = GATE_TICK,
) -> Schedule:
    """Simulate ``trace`` under ``discipline`` on ``workers`` slots until every document ran;
    ``overhead`` is the seconds between a slot taking a document and starting it;
    ``limits``, one per client index, are enforced by a gate ticking every ``gate_tick``
    seconds."""
    if workers < 1:
        raise ValueError(f"workers {workers!r} must be at least 1")
    if not (0 <= overhead < math.inf):
        raise ValueError(f"overhead {overhead!r} must be 0 or more seconds")
    if limits is not None and any(limits):
        return _run_gated(trace, discipline, workers, overhead, Gate(trace, limits, gate_tick))
    n = len(trace)
    at, duration, client = trace.at, trace.duration, trace.client
    published = [0.0] * n
    started = [0.0] * n
    finished = [0.0] * n
    discipline.prepare(trace, published)
    publish, take, finish, sweep = discipline.publish, discipline.take, discipline.finish, discipline.sweep

    opened, followers = _openings(trace)
    released: list[tuple[float, int]] = []  # closed-loop publishes that fell due: (time, doc)
    running: list[tuple[float, int]] = []  # (finish time, doc)
    n_open = len(opened)
    every = discipline.sweep_every if discipline.sweep_every is not None else math.inf
    first = at[opened[0]]
    next_sweep = math.inf
    inf = math.inf
    free = workers
    waiting = 0
    i = 0

    while True:
        if i < n_open:
            doc = opened[i]
            ta = at[doc]
        else:
            doc = -1
            ta = inf
        from_released = False
        if released:
            rt, rd = released[0]
            if rt < ta or (rt == ta and rd < doc):
                ta, doc, from_released = rt, rd, True
        tf = running[0][0] if running else inf
        if tf <= ta:
            if tf == inf:
                break
            if waiting and next_sweep <= tf:
                sweep(next_sweep)
                next_sweep += every
                continue
            _, done = heappop(running)
            finish(done, client[done], tf)
            if followers and done in followers:
                for f in followers[done]:
                    heappush(released, (tf + at[f], f))
            if waiting:
                waiting -= 1
                nxt = take()
                started[nxt] = begin = tf + overhead
                finished[nxt] = end = begin + duration[nxt]
                heappush(running, (end, nxt))
            else:
                free += 1
            continue
        if waiting and next_sweep <= ta:
            sweep(next_sweep)
            next_sweep += every
            continue
        if from_released:
            heappop(released)
        else:
            i += 1
        published[doc] = ta
        publish(doc, client[doc], ta)
        if free:
            free -= 1
            nxt = take()
            started[nxt] = begin = ta + overhead
            finished[nxt] = end = begin + duration[nxt]
            heappush(running, (end, nxt))
        else:
            if not waiting and every < inf:
                next_sweep = first + (math.floor((ta - first) / every) + 1) * every
            waiting += 1
    return Schedule(published, started, finished)


def _openings(trace: Trace) -> tuple[list[int], dict[int, list[int]]]:
    """The documents published at a time of their own, and each document's closed-loop followers."""
    followers: dict[int, list[int]] = {}
    if not trace.after:
        return list(range(len(trace))), followers
    for i, a in enumerate(trace.after):
        if a >= 0:
            followers.setdefault(a, []).append(i)
    return [i for i, a in enumerate(trace.after) if a < 0], followers


def _run_gated(trace: Trace, discipline: Discipline, workers: int, overhead: float, gate: Gate) -> Schedule:
    """:func:`run` with the gate between the queue and the slots: a slot that takes a held
    document takes the next one at once, and released documents go back to the queue."""
    n = len(trace)
    at, duration, client = trace.at, trace.duration, trace.client
    published = [0.0] * n
    started = [0.0] * n
    finished = [0.0] * n
    discipline.prepare(trace, published)
    opened, followers = _openings(trace)
    released: list[tuple[float, int]] = []  # closed-loop publishes that fell due: (time, doc)
    running: list[tuple[float, int]] = []  # (finish time, doc)
    every = discipline.sweep_every if discipline.sweep_every is not None else math.inf
    first = at[opened[0]]
    inf = math.inf
    next_sweep = inf
    free = workers
    queued = 0
    i = 0

    def fill(now: float) -> None:
        nonlocal free, queued
        while free and queued:
            doc = discipline.take()
            queued -= 1
            if gate.admit(doc, client[doc], now):
                free -= 1
                started[doc] = begin = now + overhead
                finished[doc] = end = begin + duration[doc]
                heappush(running, (end, doc))

    def requeue(docs: list[int], now: float) -> None:
        nonlocal queued
        for doc in docs:
            discipline.requeue(doc, client[doc], now)
        queued += len(docs)

    while True:
        doc, ta = (opened[i], at[opened[i]]) if i < len(opened) else (-1, inf)
        from_released = False
        if released:
            rt, rd = released[0]
            if rt < ta or (rt == ta and rd < doc):
                ta, doc, from_released = rt, rd, True
        tf = running[0][0] if running else inf
        tt = gate.next_tick if gate.ticking else inf
        ts = next_sweep if queued else inf
        now = min(ta, tf, tt, ts)
        if now == inf:
            break
        if ts == now:
            discipline.sweep(now)
            next_sweep += every
            continue
        if tf == now:
            _, done = heappop(running)
            free += 1
            discipline.finish(done, client[done], now)
            for f in followers.get(done, ()):
                heappush(released, (now + at[f], f))
            requeue(gate.ended(done, client[done], now, queued), now)
        elif tt == now:
            gate.ticked()
            requeue(gate.due(now), now)
            fill(now)
            if free and not queued:
                requeue(gate.lend(now, free), now)
        else:
            if from_released:
                heappop(released)
            else:
                i += 1
            published[doc] = now
            discipline.publish(doc, client[doc], now)
            queued += 1
        fill(now)
        if not queued:
            next_sweep = inf
        elif next_sweep == inf and every < inf:
            next_sweep = first + (math.floor((now - first) / every) + 1) * every
    return Schedule(published, started, finished, gate.stats())
