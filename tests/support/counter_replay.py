"""Random publishes and ends replayed through the router's real counters and the
simulator's in-memory ones, every answer compared (tests/unit/test_simulation_counters.py,
tests/integration/test_simulation_real_time.py)."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable

from priority_router.simulation.counters import InflightCount, SeedCount
from priority_router.store.counter import Counter
from priority_router.store.inflight import InflightCounter

CLIENTS = ("acme", "globex", "initech")

#: One step of a sequence: (tick, client, "publish" or "end", task id)
Step = tuple[int, str, str, str]


def sequence(seed: int, ticks: int, per_tick: int, pause: float) -> list[Step]:
    """Random publishes and ends: each tick, up to ``per_tick`` steps of random clients,
    and with probability ``pause`` none (so clients go idle past the interval)."""
    rng = random.Random(seed)
    steps: list[Step] = []
    published: dict[str, list[str]] = {c: [] for c in CLIENTS}
    for tick in range(ticks):
        if rng.random() < pause:
            continue
        for _ in range(rng.randint(1, per_tick)):
            client = rng.choice(CLIENTS)
            mine = published[client]
            if mine and rng.random() < 0.45:
                # Oldest first mostly; sometimes a stale or never-published id, whose end
                # still re-arms the list's TTL in Redis.
                roll = rng.random()
                task = mine.pop(0) if roll < 0.7 else mine.pop() if roll < 0.9 else f"ghost-{uuid.uuid4()}"
                steps.append((tick, client, "end", task))
            else:
                task = str(uuid.uuid4())
                mine.append(task)
                steps.append((tick, client, "publish", task))
    return steps


def replay_seed(steps: list[Step], counter: Counter, model: SeedCount, now: Callable[[int], float]) -> None:
    for tick, client, _, _ in steps:
        t = now(tick)
        got = counter.record(client)
        assert got == model.record(client, t), (tick, client)
        for other in CLIENTS:
            assert counter.read(other).pending == model.pending(other, t), (tick, other)


def replay_inflight(
    steps: list[Step], counter: InflightCounter, model: InflightCount, now: Callable[[int], float]
) -> None:
    for tick, client, action, task in steps:
        t = now(tick)
        if action == "publish":
            assert counter.record(client, task) == model.record(client, task, t), (tick, client, action)
        else:
            ended = counter.end(client, task) is not None
            assert ended == model.end(client, task, t), (tick, client, action)
        for other in CLIENTS:
            assert counter.read(other).pending == model.pending(other, t), (tick, other)
