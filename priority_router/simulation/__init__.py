"""``priority-router simulate``: how each queue policy would treat a trace, without a broker or Redis.

A discrete-event simulation (``engine``) of ``workers`` slots taking documents from one
queue discipline (``policies``): plain Celery's FIFO, the router's seed and inflight
modes with and without ``max_wait`` (the router's own threshold table, tiers and sweep
rule; ``counters`` restates the Redis reset; ``costs`` what each document counts for), and
round robin over clients, per document and by cost, as the ideal references.  Per-client
limits (caps, borrowing, rates: ``gate``) apply under every discipline, as the workers'
gate enforces them.
``docs/simulate.md`` describes the model and its assumptions.
"""

from __future__ import annotations

from .compare import compare
from .engine import Schedule, run
from .gate import GATE_TICK, Gate, GateStats
from .metrics import ClientWaits, Outcome, jain, p95, slowdown, summarize
from .policies import EVERY_POLICY, POLICIES, DeficitRoundRobin, Fifo, RoundRobin, RouterQueue, build
from .tiers import Tiers, TierSpecError, load_tiers_csv, parse_client_tier, parse_tier
from .trace import Trace, TraceBuilder, TraceError, load_csv
from .workloads import WORKLOADS, HeavyMix, MixedSizes, NoisyNeighbour, SlowNeighbour, SteadyBurst

__all__ = [
    "EVERY_POLICY",
    "GATE_TICK",
    "POLICIES",
    "WORKLOADS",
    "ClientWaits",
    "DeficitRoundRobin",
    "Fifo",
    "Gate",
    "GateStats",
    "HeavyMix",
    "MixedSizes",
    "NoisyNeighbour",
    "Outcome",
    "RoundRobin",
    "RouterQueue",
    "Schedule",
    "SlowNeighbour",
    "SteadyBurst",
    "TierSpecError",
    "Tiers",
    "Trace",
    "TraceBuilder",
    "TraceError",
    "build",
    "compare",
    "jain",
    "load_csv",
    "load_tiers_csv",
    "p95",
    "parse_client_tier",
    "parse_tier",
    "run",
    "slowdown",
    "summarize",
]
