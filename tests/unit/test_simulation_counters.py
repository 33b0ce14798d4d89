"""The simulator's in-memory counts behave exactly as the router's Redis stores.

The same random sequence of (time, client) publishes and ends goes through the router's
real ``Counter`` / ``InflightCounter`` and through ``SeedCount`` / ``InflightCount``; every
answer and every read must be identical.  On fakeredis the clock is driven (thousands of
events, gaps landing exactly on the reset interval); on a real Redis, with real sleeps,
tests/integration/test_simulation_real_time.py.
"""

from __future__ import annotations

import random
import types
from collections.abc import Iterator
from itertools import pairwise

import fakeredis
import fakeredis._socket._base as fake_socket
import pytest
import redis
from support.counter_replay import CLIENTS, Step, replay_inflight, replay_seed, sequence

from priority_router import DEFAULT_THRESHOLDS
from priority_router.simulation.counters import InflightCount, SeedCount
from priority_router.store.costs import ONE, as_count, cost_units
from priority_router.store.counter import Counter
from priority_router.store.inflight import InflightCounter

# -- the semantics, stated -----------------------------------------------------------------


def test_seed_count_gives_the_scheme_worked_example() -> None:
    count = SeedCount(reset_interval=1500)
    got = [DEFAULT_THRESHOLDS.priority_for(count.record("acme", 0.1 * i)) for i in range(22)]
    assert got == [1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 8, 8, 8, 8, 9]


def test_seed_count_resets_after_more_than_the_interval_since_the_last_check() -> None:
    count = SeedCount(reset_interval=10)
    assert [count.record("a", t) for t in (0, 9, 18, 27)] == [0, -1, -2, -3]  # each check re-arms
    assert count.record("a", 37) == -4  # exactly the interval: Redis keeps the key
    assert count.record("a", 47.001) == 0
    assert count.pending("a", 47.5) == 0 and count.pending("b", 0) == 0


def test_inflight_count_is_one_minus_the_documents_in_flight() -> None:
    count = InflightCount(reset_interval=10)
    assert [count.record("a", d, 0) for d in ("d1", "d2", "d3")] == [0, -1, -2]
    assert count.end("a", "d1", 1) is True
    assert count.end("a", "d1", 1) is False  # ended once only
    assert count.record("a", "d4", 2) == -2
    for d in ("d2", "d3", "d4"):
        count.end("a", d, 3)
    assert count.record("a", "d5", 4) == 0


def test_inflight_end_of_an_unknown_document_still_rearms_the_reset() -> None:
    count = InflightCount(reset_interval=10)
    count.record("a", "d1", 0)
    assert count.end("a", "nobody", 8) is False
    assert count.record("a", "d2", 17) == -1  # 9 s after the end, not 17 s after the publish


def test_inflight_documents_of_an_expired_list_are_not_counted_again() -> None:
    count = InflightCount(reset_interval=10)
    count.record("a", "old", 0)
    assert count.record("a", "new", 11) == 0  # the list expired: a new spell
    assert count.end("a", "old", 12) is False
    assert count.record("a", "newer", 13) == -1  # "new" is still in flight


# -- the same sequence through the real stores ---------------------------------------------


class DrivenClock:
    """fakeredis's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now


@pytest.fixture
def driven_fakeredis(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[redis.Redis, DrivenClock]]:
    clock = DrivenClock()
    # fakeredis stamps every command with time.time() read in this module.
    monkeypatch.setattr(fake_socket, "time", types.SimpleNamespace(time=clock.time))
    yield fakeredis.FakeRedis(), clock


# Times on a 1/8 s grid and a 0.5 s interval are exact in binary, so gaps that land
# exactly on the interval are compared exactly (Redis keeps a key while now <= expiry).
GRID = 0.125
INTERVAL = 0.5


@pytest.mark.parametrize("seed", range(5))
def test_seed_count_matches_the_redis_counter_on_a_driven_clock(
    driven_fakeredis: tuple[redis.Redis, DrivenClock], seed: int
) -> None:
    client, clock = driven_fakeredis
    steps = sequence(seed, ticks=600, per_tick=3, pause=0.5)
    counter = Counter(client, f"sim-{seed}:", reset_interval=INTERVAL)
    start = clock.now

    def now(tick: int) -> float:
        clock.now = start + tick * GRID
        return tick * GRID

    replay_seed(steps, counter, SeedCount(INTERVAL), now)
    resets = sum(1 for a, b in pairwise(steps) if (b[0] - a[0]) * GRID > INTERVAL)
    assert resets > 10, "the sequence must cross the reset interval often to test it"


@pytest.mark.parametrize("seed", range(5))
def test_inflight_count_matches_the_redis_list_on_a_driven_clock(
    driven_fakeredis: tuple[redis.Redis, DrivenClock], seed: int
) -> None:
    client, clock = driven_fakeredis
    steps = sequence(seed, ticks=600, per_tick=3, pause=0.5)
    counter = InflightCounter(client, f"sim-{seed}:", reset_interval=INTERVAL)
    start = clock.now

    def now(tick: int) -> float:
        clock.now = start + tick * GRID
        return tick * GRID

    replay_inflight(steps, counter, InflightCount(INTERVAL), now)


# -- counting by cost ----------------------------------------------------------------------
# The counters count whatever whole units they are given; the router's policies give each
# document its cost in thousandths (costs.RESOLUTION per cost 1).


def test_a_seed_check_is_at_minus_the_costs_counted_before_it_in_the_spell() -> None:
    count = SeedCount(reset_interval=10, one=1000)
    assert [count.record("a", t, u) for t, u in ((0, 30_000), (1, 1000), (2, 2500), (3, 500))] == [
        0,  # the spell's first document, however large
        -30_000,
        -31_000,
        -33_500,
    ]
    assert count.pending("a", 3) == 1000 - 34_000  # a read: 1 - what the spell counted
    assert count.record("a", 14, 7000) == 0  # idle more than the interval: a new spell
    assert count.record("a", 15, 1000) == -7000


def test_an_inflight_check_is_at_minus_the_costs_in_flight_and_an_end_gives_its_cost_back_once() -> None:
    count = InflightCount(reset_interval=10, one=1000)
    assert count.record("a", "scan", 0, 30_000) == 0
    assert count.record("a", "invoice", 0, 1000) == -30_000
    assert count.end("a", "scan", 1, 30_000) is True
    assert count.end("a", "scan", 1, 30_000) is False  # once only
    # Only the invoice is in flight, but the note goes behind it: checked where it was checked.
    assert count.record("a", "note", 2, 2500) == -30_000
    assert count.pending("a", 2) == 1000 - 3500
    assert count.end("a", "invoice", 3, 1000) and count.end("a", "note", 3, 2500)
    assert count.pending("a", 3) == 0 and count.record("a", "next", 4, 1000) == 0  # nothing in flight


def test_an_end_of_a_costed_document_from_an_expired_list_gives_nothing_back() -> None:
    count = InflightCount(reset_interval=10, one=1000)
    count.record("a", "old", 0, 5000)
    assert count.record("a", "new", 11, 2000) == 0  # the list expired: a new spell
    assert count.end("a", "old", 12, 5000) is False
    assert count.record("a", "newer", 13, 1000) == -2000  # "new" is still in flight, and only it


@pytest.mark.parametrize("seed", range(3))
def test_a_cost_of_one_in_thousandths_is_the_count_in_documents_exactly(seed: int) -> None:
    """The units change nothing but the scale: every answer is 1000x the document count."""
    steps = sequence(seed, ticks=600, per_tick=3, pause=0.5)
    docs, units = SeedCount(INTERVAL), SeedCount(INTERVAL, one=1000)
    flight, flight_units = InflightCount(INTERVAL), InflightCount(INTERVAL, one=1000)
    for tick, client, action, task in steps:
        t = tick * GRID
        assert units.record(client, t, 1000) == 1000 * docs.record(client, t)
        if action == "publish":
            assert flight_units.record(client, task, t, 1000) == 1000 * flight.record(client, task, t)
        else:
            assert flight_units.end(client, task, t, 1000) == flight.end(client, task, t)
        for other in CLIENTS:
            assert units.pending(other, t) == 1000 * docs.pending(other, t)
            assert flight_units.pending(other, t) == 1000 * flight.pending(other, t)


# The router's own costed stores against the simulator's counters, on one driven clock:
# each task gets a cost (a few of 1, some fractional, some large), every check and end
# reads the extras as a router does once costs are in use.
COSTS = (1, 1, 1, 2.5, 0.3, 30, 0.001, 7.25, 1000)


def costed_steps(seed: int) -> tuple[list[Step], dict[str, int]]:
    steps = sequence(seed, ticks=600, per_tick=3, pause=0.5)
    rng = random.Random(seed)
    return steps, {task: cost_units(rng.choice(COSTS)) for _, _, _, task in steps}


@pytest.mark.parametrize("seed", range(4))
def test_costed_seed_counts_match_the_redis_counter_on_a_driven_clock(
    driven_fakeredis: tuple[redis.Redis, DrivenClock], seed: int
) -> None:
    client, clock = driven_fakeredis
    steps, units = costed_steps(seed)
    counter = Counter(client, f"sim-cost-{seed}:", reset_interval=INTERVAL)
    model = SeedCount(INTERVAL, one=ONE)
    start = clock.now
    for tick, who, _, task in steps:
        clock.now = start + tick * GRID
        t = tick * GRID
        (got,), _ = counter.count(who, 1, units[task], costs=True)
        assert got == as_count(model.record(who, t, units[task])), (tick, who, units[task])
        for other in CLIENTS:
            assert counter.read(other).pending == as_count(model.pending(other, t)), (tick, other)


@pytest.mark.parametrize("seed", range(4))
def test_costed_inflight_counts_match_the_redis_list_on_a_driven_clock(
    driven_fakeredis: tuple[redis.Redis, DrivenClock], seed: int
) -> None:
    client, clock = driven_fakeredis
    steps, units = costed_steps(seed)
    counter = InflightCounter(client, f"sim-cost-{seed}:", reset_interval=INTERVAL)
    model = InflightCount(INTERVAL, one=ONE)
    start = clock.now
    for tick, who, action, task in steps:
        clock.now = start + tick * GRID
        t = tick * GRID
        cost = units.get(task, ONE)  # a ghost's end: cost 1
        if action == "publish":
            got, _ = counter.count(who, task, cost, costs=True)
            assert got == as_count(model.record(who, task, t, cost)), (tick, who, action, cost)
        else:
            ended = counter.end(who, task, cost, costs=True)
            assert (ended is not None) == model.end(who, task, t, cost), (tick, who)
            assert ended in (None, cost), "counted at the cost its end gave"
        for other in CLIENTS:
            assert counter.read(other).pending == as_count(model.pending(other, t)), (tick, other)
