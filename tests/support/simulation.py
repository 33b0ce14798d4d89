"""Small traces and what happened to them, for the simulator's tests."""

from __future__ import annotations

from collections.abc import Iterable

from priority_router.simulation.engine import Schedule
from priority_router.simulation.trace import Trace, TraceBuilder


def trace_of(*docs: tuple[float, str, float]) -> Trace:
    """A trace of ``(at, client, duration)`` documents; each client is its own group."""
    builder = TraceBuilder()
    for at, client, duration in docs:
        builder.add(client, client, at, duration)
    return builder.build()


def started_of(schedule: Schedule, docs: Trace, client: str) -> list[float]:
    """When each of ``client``'s documents started, in trace order."""
    return [schedule.started[i] for i, c in enumerate(docs.client) if docs.clients[c] == client]


def most_at_once(spans: Iterable[tuple[float, float]]) -> int:
    """The most (start, end) spans that overlap at one instant; an end and a start at the
    same instant do not overlap."""
    pairs = list(spans)
    events = sorted([(start, 1) for start, _ in pairs] + [(end, -1) for _, end in pairs])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most
