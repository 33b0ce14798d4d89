"""The table search of ``simulation/tune.py``: its p95 is the simulator's, and a search in
processes ranks the tables exactly as one process does."""

from __future__ import annotations

import random

from priority_router.simulation.metrics import p95
from priority_router.simulation.trace import counted_by
from priority_router.simulation.tune import Case, baseline, candidates, search, sorted_p95
from priority_router.simulation.workloads import DEFAULT_SEED, WORKLOADS
from priority_router.thresholds import Policy


def test_the_p95_of_sorted_values_is_the_simulators_p95_exactly() -> None:
    rng = random.Random(11)
    for n in [*range(1, 60), 99, 100, 101, 1000]:
        values = sorted(rng.expovariate(1) for _ in range(n))
        assert sorted_p95(values) == p95(values)


def test_a_search_in_processes_ranks_as_one_process_does() -> None:
    trace = counted_by(WORKLOADS["giant-and-medium"](DEFAULT_SEED).trace(), "document")
    base = baseline(Case("giant-and-medium", trace, 8))
    tables: list[Policy] = candidates()[::20]
    alone = search([base], tables)
    shared = search([base], tables, jobs=2)
    assert [(r.table, r.verdicts) for r in shared] == [(r.table, r.verdicts) for r in alone]
