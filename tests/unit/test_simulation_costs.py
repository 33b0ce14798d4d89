"""Counting each document by its cost: the units, the truncation, tiers, and the router's policies."""

from __future__ import annotations

import random

import pytest
from support.simulation import trace_of

from priority_router import DEFAULT_THRESHOLDS, Policy, RouterConfig
from priority_router.simulation import costs
from priority_router.simulation.compare import compare
from priority_router.simulation.costs import MAX_COST, ONE, as_count, cost_units, level, whole
from priority_router.simulation.engine import run
from priority_router.simulation.policies import RouterQueue
from priority_router.simulation.tiers import Tiers
from priority_router.simulation.trace import Trace, TraceBuilder, counted_by
from priority_router.store import costs as store_costs
from priority_router.tiers import Tier


def costed(*docs: tuple[float, str, float, float]) -> Trace:
    """A trace of ``(at, client, duration, cost)`` documents; each client is its own group."""
    builder = TraceBuilder()
    for at, client, duration, cost in docs:
        builder.add(client, client, at, duration, units=cost_units(cost))
    return builder.build()


def priorities(queue: RouterQueue, docs: Trace) -> list[int]:
    """The priority each document is published at, all published at their times."""
    published = [0.0] * len(docs)
    queue.prepare(docs, published)
    for doc in range(len(docs)):
        queue.publish(doc, docs.client[doc], docs.at[doc])
    found = {doc: p for p, waiting in enumerate(queue._lists) for doc in waiting}
    return [found[doc] for doc in range(len(docs))]


def test_the_units_limits_and_rounding_are_the_routers() -> None:
    assert (costs.cost_units, costs.as_count, costs.InvalidCost) == (
        store_costs.cost_units,
        store_costs.as_count,
        store_costs.InvalidCost,
    )
    assert (ONE, costs.MAX_UNITS) == (1000, MAX_COST * 1000)
    assert [cost_units(c) for c in (1, 2.5, 0.001, 0.0015, 30)] == [ONE, 2500, 1, 2, 30_000]


def test_a_fractional_count_is_truncated_toward_zero() -> None:
    assert [whole(u) for u in (0, -999, -1000, -2500, -2999, -3000)] == [0, 0, -1, -2, -2, -3]
    rng = random.Random(2)
    for units in [0, -1, -999, -1000, -1001, *(-rng.randrange(10**12) for _ in range(2000))]:
        assert whole(units) == int(as_count(units))  # the router truncates its count so


@pytest.mark.parametrize(
    ("tier", "pending", "table_count"),
    [
        (None, -2.9, -2),  # a partial unit does not count
        (None, -0.5, 0),
        (Tier(shift=1), -2.5, -2),  # shift as before, on the truncated count
        (Tier(weight=2), -4.5, -2),  # int(-4.5 / 2) = int(-2.25)
        (Tier(weight=0.5), -2.5, -5),  # divided first: truncating first would give -4
        (Tier(weight=0.3, shift=2), -1.25, -4),  # int(-4.1666...)
    ],
)
def test_a_fractional_count_gets_the_routers_priority(
    tier: Tier | None, pending: float, table_count: int
) -> None:
    shift = 0 if tier is None else tier.shift
    expected = min(9, max(1, DEFAULT_THRESHOLDS.priority_for(table_count) + shift))
    assert level(tier, pending, DEFAULT_THRESHOLDS) == expected


def test_a_fixed_tier_ignores_the_count() -> None:
    assert level(Tier(fixed=7), -0.5, DEFAULT_THRESHOLDS) == 7
    assert level(Tier(fixed=2), -123.456, DEFAULT_THRESHOLDS) == 2


@pytest.mark.parametrize("mode", ["seed", "inflight"])
def test_the_router_checks_a_document_at_minus_the_costs_before_it(mode: str) -> None:
    # One client, all published at once (nothing finishes): counts 0, -30, -31, -31.5, -33.
    docs = costed(*[(0.0, "a", 1.0, cost) for cost in (30, 1, 0.5, 1.5, 1)])
    table = Policy.from_rows([(-33, 9), (-31, 5), (-30, 4), (0, 2)], fallback=1)
    # -31.5 truncates to -31, which is not below -31: priority 4 like -31, not 5.
    assert priorities(RouterQueue(mode, table, 1500), docs) == [1, 2, 4, 4, 5]


@pytest.mark.parametrize("mode", ["seed", "inflight"])
def test_a_uniform_cost_is_a_tier_weight_of_its_inverse_by_document(mode: str) -> None:
    """Cost 2 each halves the depth a client reaches by document: exactly weight 0.5."""
    rng = random.Random(3)
    rows = sorted((rng.uniform(0, 30), rng.choice("abcd"), rng.uniform(0.5, 2.0)) for _ in range(300))
    by_cost = costed(*[(at, c, d, 2.0) for at, c, d in rows])
    by_document = trace_of(*rows)
    weighted = Tiers({}, Tier(weight=0.5)).prioritize(DEFAULT_THRESHOLDS)
    cost_run = run(by_cost, RouterQueue(mode, DEFAULT_THRESHOLDS, 5.0), 2)
    tier_run = run(by_document, RouterQueue(mode, DEFAULT_THRESHOLDS, 5.0, prioritize=weighted), 2)
    assert cost_run.started == tier_run.started


def test_costs_and_tiers_together_divide_the_cost_count_by_the_weight() -> None:
    # Costs 1.5 each: counts 0, -1.5, -3, -4.5, -6; weight 2: int(-0.75)... = 0, 0, -1, -2, -3.
    docs = costed(*[(0.0, "a", 1.0, 1.5)] * 5)
    tiers = Tiers({"a": Tier(weight=2)}).prioritize(DEFAULT_THRESHOLDS)
    table = [DEFAULT_THRESHOLDS.priority_for(c) for c in (0, 0, -1, -2, -3)]
    assert priorities(RouterQueue("seed", DEFAULT_THRESHOLDS, 1500, prioritize=tiers), docs) == table


def test_a_cost_column_of_ones_is_the_scheme_without_costs() -> None:
    rows = [(0.1 * i, "heavy" if i % 3 else "light", 0.5) for i in range(40)]
    docs = costed(*[(*row, 1.0) for row in rows])
    assert docs.cost_units == []  # every cost 1: nothing to count but documents
    for mode in ("seed", "inflight"):
        with_ones = run(docs, RouterQueue(mode, DEFAULT_THRESHOLDS, 1500), 2)
        without = run(trace_of(*rows), RouterQueue(mode, DEFAULT_THRESHOLDS, 1500), 2)
        assert with_ones == without


def test_counted_by_chooses_what_a_document_costs() -> None:
    docs = costed((0.0, "a", 2.5, 4.0), (0.0, "a", 0.0002, 1.0), (1.0, "b", 1.0, 1.0))
    assert docs.cost_units == [4000, ONE, ONE]
    assert counted_by(docs, "column") is docs
    assert counted_by(docs, "document").cost_units == []
    # Its seconds, to the thousandth; shorter than the smallest cost counts that much.
    assert counted_by(docs, "duration").cost_units == [2500, 1, ONE]
    assert counted_by(trace_of((0.0, "a", 1.0), (0.5, "b", 1.0)), "duration").cost_units == []
    with pytest.raises(ValueError, match="not one of column, duration, document"):
        counted_by(docs, "pages")


def test_compare_counts_as_told() -> None:
    docs = trace_of(*[(0.0, "big", 10.0)] * 4, *[(0.5, "small", 1.0)] * 4)
    config = RouterConfig()
    by_document = compare(docs, ["seed"], config, 1)["seed"]
    by_seconds = compare(docs, ["seed"], config, 1, cost="duration")["seed"]
    # By seconds, big's 2nd document is at -10 (priority 6): small's go first.
    assert by_seconds.per_client["small"].max_wait < by_document.per_client["small"].max_wait
