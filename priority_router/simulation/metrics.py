"""Fairness metrics, shared by the simulator and the real-broker benchmarks (``bench/``).

A document's wait is from its publish to its start.  A client's slowdown is
mean(wait + service) / mean(service) over its documents; Jain's index over the clients'
slowdowns is 1.0 when every client is slowed down alike and 1/n when one takes it all.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .engine import Schedule
from .gate import GateStats
from .trace import Trace


def slowdown(waits: list[float], services: list[float]) -> float:
    """A client's slowdown: mean(wait + service) / mean(service) over its documents.

    1.0 means its documents never waited; 3.0, that they took three times their own length
    from publish to finish on average."""
    if not services or len(waits) != len(services):
        raise ValueError("one wait per service time, and at least one document")
    return (sum(waits) + sum(services)) / sum(services)


def jain(values: list[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n * sum x^2): 1.0 when every x is equal, down to
    1/n when one client gets all of it."""
    if not values or any(v < 0 for v in values):
        raise ValueError("Jain's index needs at least one value, none negative")
    squares = sum(v * v for v in values)
    return 1.0 if squares == 0 else sum(values) ** 2 / (len(values) * squares)


def p95(values: list[float]) -> float:
    """The 95th percentile (inclusive), or the one value there is."""
    return statistics.quantiles(values, n=20, method="inclusive")[18] if len(values) > 1 else values[0]


def waits_by_group(
    published: dict[str, tuple[str, float]], results: dict[str, dict[str, Any]]
) -> dict[str, list[float]]:
    """Each group's waits: a document's start (its report) minus the time it was published."""
    waits: dict[str, list[float]] = {"heavy": [], "light": []}
    for tid, (group, at) in published.items():
        waits[group].append(results[tid]["started_at"] - at)
    return waits


@dataclass(frozen=True)
class ClientWaits:
    """One client's documents and their waits (seconds)."""

    documents: int
    p50_wait: float
    p95_wait: float
    max_wait: float
    #: Its documents that started before one it published earlier.
    overtakes: int = 0


@dataclass(frozen=True)
class Outcome:
    """What one policy did to a trace."""

    policy: str
    #: Seconds from the first publish to the last finish.
    makespan: float
    #: Jain's index of the clients' slowdowns.
    jain: float
    per_client: dict[str, ClientWaits]
    #: Each document's wait, in trace order (for the groups and the plot).
    waits: list[float]
    #: Client -> what the workers' gate did to it, for each client with limits.
    gated: dict[str, GateStats] = field(default_factory=dict)

    @property
    def overtakes(self) -> int:
        """Documents that started before one their client published earlier."""
        return sum(w.overtakes for w in self.per_client.values())


def summarize(policy: str, trace: Trace, schedule: Schedule) -> Outcome:
    """The metrics of ``schedule``, a run of ``trace`` under ``policy``."""
    waits = [s - p for s, p in zip(schedule.started, schedule.published, strict=True)]
    by_client: list[list[float]] = [[] for _ in trace.clients]
    services: list[list[float]] = [[] for _ in trace.clients]
    # A document overtakes when it started before one its client published earlier (the
    # trace's order): before the latest start of the client's documents so far.
    latest = [float("-inf")] * len(trace.clients)
    overtakes = [0] * len(trace.clients)
    for c, w, d, s in zip(trace.client, waits, trace.duration, schedule.started, strict=True):
        by_client[c].append(w)
        services[c].append(d)
        if s < latest[c]:
            overtakes[c] += 1
        else:
            latest[c] = s
    per_client = {}
    slowdowns = []
    for c, client_id in enumerate(trace.clients):
        mine = sorted(by_client[c])
        per_client[client_id] = ClientWaits(
            len(mine), statistics.median(mine), p95(mine), mine[-1], overtakes[c]
        )
        slowdowns.append(slowdown(mine, services[c]))
    makespan = max(schedule.finished) - min(schedule.published)
    gated = {trace.clients[c]: stats for c, stats in schedule.gated.items()}
    return Outcome(policy, makespan, jain(slowdowns), per_client, waits, gated)


def group_waits(trace: Trace, waits: list[float]) -> dict[str, list[float]]:
    """Each group's document waits, groups in :func:`group_order`."""
    grouped: dict[str, list[float]] = {g: [] for g in group_order(trace)}
    groups = trace.groups
    for c, w in zip(trace.client, waits, strict=True):
        grouped[groups[c]].append(w)
    return grouped


def group_order(trace: Trace) -> list[str]:
    """The trace's groups, those with fewer documents per client first ("light" before "heavy")."""
    clients = Counter(trace.groups)
    documents = Counter(trace.groups[c] for c in trace.client)
    return sorted(clients, key=lambda g: documents[g] / clients[g])
