"""The simulator's figures for ``thresholds="wide"`` meet issue #30's criteria on its trace."""

from __future__ import annotations

import pytest

from priority_router.simulation.trace import counted_by
from priority_router.simulation.tune import Case, baseline, client_groups, judge
from priority_router.simulation.workloads import DEFAULT_SEED, WORKLOADS
from priority_router.thresholds import DEFAULT_THRESHOLDS, WIDE_THRESHOLDS


@pytest.mark.parametrize("mode", ["seed", "inflight"])
def test_wide_serves_the_medium_client_as_drr_would(mode: str) -> None:
    # One client's 1,000 documents, a medium client's 60 a second later, 12 light clients;
    # documents of 1-3 s on 8 slots (the giant-and-medium workload, seeded).
    trace = counted_by(WORKLOADS["giant-and-medium"](DEFAULT_SEED).trace(), "document")
    base = baseline(Case("giant-and-medium", trace, 8, mode))
    medium = base.groups.index("medium")
    assert client_groups(trace).count("medium") == 1

    wide = judge(base, WIDE_THRESHOLDS)
    assert wide.score <= 1.0, wide
    assert wide.p95[medium] <= max(1.1 * base.drr[medium], base.drr[medium] + 2)
    for mine, ideal in zip(wide.p95, base.drr, strict=True):
        assert mine <= max(1.5 * ideal, ideal + 2)
    light = [w for g, w in zip(base.groups, wide.p95, strict=True) if g == "light"]
    before = [w for g, w in zip(base.groups, base.default, strict=True) if g == "light"]
    assert max(light) <= max(1.1 * max(before), max(before) + base.turn)

    # The issue: with the scheme's table the medium client waits longer than under FIFO.
    assert base.default[medium] > base.fifo[medium] > 5 * base.drr[medium]
    assert judge(base, DEFAULT_THRESHOLDS).score > 5
