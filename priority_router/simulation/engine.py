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
  worker here spends 1-2 ms with plain Celery's prefetch and 3-4 ms with the router's
  prefetch of 1, as ``bench/simulate_fidelity.py`` measures).
- Events at one instant happen in this order: the max_wait sweep, then documents
  finishing (the freed slot takes its next document at once), then publishes, in trace
  order.
- Sweeps run every ``sweep_every`` seconds from the first publish, as a worker's sweeper
  thread does from its start; sweeps while nothing waits are skipped, as they move
  nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from heapq import heappop, heappush

from .policies import Discipline
from .trace import Trace


@dataclass(frozen=True)
class Schedule:
    """When each document was published, started and finished (seconds, trace time)."""

    published: list[float]
    started: list[float]
    finished: list[float]


def run(trace: Trace, discipline: Discipline, workers: int, overhead: float = 0.0) -> Schedule:
    """Simulate ``trace`` under ``discipline`` on ``workers`` slots until every document ran;
    ``overhead`` is the seconds between a slot taking a document and starting it."""
    if workers < 1:
        raise ValueError(f"workers {workers!r} must be at least 1")
    if not (0 <= overhead < math.inf):
        raise ValueError(f"overhead {overhead!r} must be 0 or more seconds")
    n = len(trace)
    at, duration, client = trace.at, trace.duration, trace.client
    published = [0.0] * n
    started = [0.0] * n
    finished = [0.0] * n
    discipline.prepare(trace, published)
    publish, take, finish, sweep = discipline.publish, discipline.take, discipline.finish, discipline.sweep

    followers: dict[int, list[int]] = {}
    if trace.after:
        opened = [i for i, a in enumerate(trace.after) if a < 0]
        for i, a in enumerate(trace.after):
            if a >= 0:
                followers.setdefault(a, []).append(i)
    else:
        opened = list(range(n))
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
                begin = tf + overhead
                started[nxt] = begin
                end = begin + duration[nxt]
                finished[nxt] = end
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
            begin = ta + overhead
            started[nxt] = begin
            end = begin + duration[nxt]
            finished[nxt] = end
            heappush(running, (end, nxt))
        else:
            if not waiting and every < inf:
                next_sweep = first + (math.floor((ta - first) / every) + 1) * every
            waiting += 1
    return Schedule(published, started, finished)
