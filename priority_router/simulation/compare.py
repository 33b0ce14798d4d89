"""Run one trace under several policies and collect what each did."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..config import RouterConfig
from .costs import counted_by
from .engine import run
from .metrics import Outcome, summarize
from .policies import build
from .tiers import Tiers
from .trace import Trace

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
) -> dict[str, Outcome]:
    """Each policy's outcome on ``trace`` with ``workers`` slots and ``config``'s thresholds,
    reset interval and max_wait (``quantum``: the DRR quantum, default the largest cost or
    longest document; ``overhead``: seconds between a slot taking a document and starting
    it; ``tiers``: the clients' tiers, for the router's policies; ``cost``: what a document
    costs, one of ``costs.BASES``)."""
    trace = counted_by(trace, cost)
    outcomes = {}
    for name in policies:
        if progress is not None:
            progress(name)
        schedule = run(trace, build(name, config, quantum, tiers), workers, overhead)
        outcomes[name] = summarize(name, trace, schedule)
    return outcomes
