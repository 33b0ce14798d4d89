"""``priority-router simulate``: how each queue policy would treat a trace, without a broker or Redis.

A discrete-event simulation (``engine``) of ``workers`` slots taking documents from one
queue discipline (``policies``): plain Celery's FIFO, the router's seed and inflight
modes with and without ``max_wait`` (the router's own threshold table and sweep rule;
``counters`` restates the Redis reset), and deficit round robin over clients as the
ideal reference.  ``docs/simulate.md`` describes the model and its assumptions.
"""

from __future__ import annotations

from .compare import compare
from .engine import Schedule, run
from .metrics import ClientWaits, Outcome, jain, p95, slowdown, summarize
from .policies import POLICIES, DeficitRoundRobin, Fifo, RouterQueue, build
from .trace import Trace, TraceBuilder, TraceError, load_csv
from .workloads import WORKLOADS, HeavyMix, NoisyNeighbour, SteadyBurst

__all__ = [
    "POLICIES",
    "WORKLOADS",
    "ClientWaits",
    "DeficitRoundRobin",
    "Fifo",
    "HeavyMix",
    "NoisyNeighbour",
    "Outcome",
    "RouterQueue",
    "Schedule",
    "SteadyBurst",
    "Trace",
    "TraceBuilder",
    "TraceError",
    "build",
    "compare",
    "jain",
    "load_csv",
    "p95",
    "run",
    "slowdown",
    "summarize",
]
