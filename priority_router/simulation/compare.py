"""Run one trace under several policies and collect what each did."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..config import RouterConfig
from .engine import run
from .gate import GATE_TICK
from .metrics import Outcome, summarize
from .policies import build
from .tiers import Tiers
from .trace import Trace, counted_by

#: Called as ``progress(policy)`` before each policy runs.
Progress = Callable[[str], None]


def compare(
    trace: Trace,
    policies: Iterable[str],
    config: RouterConfig,
    workers: int,
    quantum: float | None = None,
    progress: Progress | None = None,
    overhead: float = 0.0,
    tiers: Tiers | None = None,
    cost: str = "column",
    gate_tick: float = GATE_TICK,
) -> dict[str, Outcome]:
    """Each policy's outcome on ``trace`` with ``workers`` slots and ``config``'s thresholds,
    reset interval and max_wait (``quantum``: the DRR quantum, default the largest cost or
    longest document; ``overhead``: seconds between a slot taking a document and starting
    it; ``tiers``: the clients' tiers, their priorities for the router's policies and their
    limits for every policy, enforced by a gate ticking every ``gate_tick`` seconds;
    ``cost``: what a document costs, one of ``trace.BASES``)."""
    trace = counted_by(trace, cost)
    limits = None if tiers is None else tiers.limits_of(trace.clients)
    outcomes = {}
    for name in policies:
        if progress is not None:
            progress(name)
        discipline = build(name, config, quantum, tiers)
        schedule = run(trace, discipline, workers, overhead, limits, gate_tick)
        outcomes[name] = summarize(name, trace, schedule)
    return outcomes
