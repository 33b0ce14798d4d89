"""The simulator's in-memory counts behave as the router's counters on a real Redis, with
real sleeps (its own TTLs): ticks 0.2 s apart and a 0.5 s interval, so an idle gap is
0.4 s or 0.6 s, 100 ms clear of the interval on either side, and the simulator is given
the clock readings taken just before each command.  The driven-clock twins, thousands of
events on fakeredis, are tests/unit/test_simulation_counters.py."""

from __future__ import annotations

import time
from collections.abc import Callable

import redis
from support.counter_replay import replay_inflight, replay_seed, sequence

from priority_router.simulation.counters import InflightCount, SeedCount
from priority_router.store.counter import Counter
from priority_router.store.inflight import InflightCounter

TICK = 0.2
REAL_INTERVAL = 0.5


def sleeping_clock() -> Callable[[int], float]:
    start = time.time()

    def now(tick: int) -> float:
        delay = start + tick * TICK - time.time()
        if delay > 0:
            time.sleep(delay)
        return time.time()

    return now


def test_seed_count_matches_the_redis_counter_in_real_time(real_redis: redis.Redis, key_prefix: str) -> None:
    steps = sequence(11, ticks=16, per_tick=3, pause=0.35)
    replay_seed(
        steps, Counter(real_redis, key_prefix, REAL_INTERVAL), SeedCount(REAL_INTERVAL), sleeping_clock()
    )


def test_inflight_count_matches_the_redis_list_in_real_time(real_redis: redis.Redis, key_prefix: str) -> None:
    steps = sequence(12, ticks=16, per_tick=3, pause=0.35)
    replay_inflight(
        steps,
        InflightCounter(real_redis, key_prefix, REAL_INTERVAL),
        InflightCount(REAL_INTERVAL),
        sleeping_clock(),
    )
