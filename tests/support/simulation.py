"""Small traces and what happened to them, for the simulator's tests."""

from __future__ import annotations

from priority_router.simulation.engine import Schedule
from priority_router.simulation.trace import Trace, TraceBuilder
from workers.workload import most_at_once  # noqa: F401 - re-exported for the tests


def trace_of(*docs: tuple[float, str, float]) -> Trace:
    """A trace of ``(at, client, duration)`` documents; each client is its own group."""
    builder = TraceBuilder()
    for at, client, duration in docs:
        builder.add(client, client, at, duration)
    return builder.build()


def started_of(schedule: Schedule, docs: Trace, client: str) -> list[float]:
    """When each of ``client``'s documents started, in trace order."""
    return [schedule.started[i] for i, c in enumerate(docs.client) if docs.clients[c] == client]
