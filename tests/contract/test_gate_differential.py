"""The simulator's gate (simulation/gate.py) and the real one (store/lua/gate.lua) make the
same decisions: random sequences of arrivals, ends, releases coming back and sweeps, for
caps, cost caps and rates, driven through both, every decision compared.

What the simulator does not model is left out: leases running out (the sequences last less
than a lease), borrowing (the simulator lends at its own ticks, the real gate at a worker's
idle sweep), limits changed mid-sequence (the simulator holds them for a whole replay) and
the broker's redeliveries.  Run on fakeredis and on a real Redis."""

from __future__ import annotations

import random

import pytest
import redis
from support.holding_queue import Queue

from priority_router.limits import Limits
from priority_router.simulation.gate import Gate
from priority_router.simulation.trace import TraceBuilder
from priority_router.store.gate import GateStore

NOW = 1_700_000_000_000
ONE = 1000
REMEMBER = 3_600_000
#: Every sequence ends before this (ms): the lease never runs out.
SPAN = 25_000

LIMITS = [
    Limits(max_in_flight=1),
    Limits(max_in_flight=3),
    Limits(max_cost_in_flight=4),
    Limits(max_in_flight=2, max_cost_in_flight=5),
    Limits(rate="4/s"),
    Limits(rate="3/s", burst=2),
    Limits(max_in_flight=2, rate="5/s"),
    Limits(max_in_flight=3, max_cost_in_flight=6, rate="10/s", burst=4),
]


@pytest.fixture(params=["fakeredis", pytest.param("redis", marks=pytest.mark.integration)])
def client(request: pytest.FixtureRequest) -> redis.Redis:
    return request.getfixturevalue("fake_redis" if request.param == "fakeredis" else "real_redis")


class Both:
    """One client's documents through the simulator's gate and the real one side by side."""

    def __init__(self, client: redis.Redis, prefix: str, limits: Limits, units: list[int]) -> None:
        builder = TraceBuilder()
        for n, u in enumerate(units):
            builder.add("acme", "g", n, 1.0, units=u)
        self.sim = Gate(builder.build(), [limits])
        self.real = GateStore(client, prefix, lease=SPAN / 1000 * 2)
        self.limits, self.units, self.queue = limits, units, Queue()
        self.held = 0

    def arrive(self, doc: int, now: int) -> bool:
        """A document (new, or released and back) reaches a worker: whether it runs."""
        runs = self.sim.admit(doc, 0, now / 1000)
        verdict = self.real.admit("acme", f"d{doc}", self.limits, self.units[doc], now_ms=NOW + now)
        if verdict.outcome == "held":
            self.queue.waiting.append((f"d{doc}", self.units[doc]))
            self.held += 1
        assert verdict.outcome in ("run", "held"), verdict
        assert runs == (verdict.outcome == "run"), (doc, now, verdict)
        return runs

    def end(self, doc: int, now: int) -> list[int]:
        """A running document ends (with more documents queued: no borrowing): the documents
        its end releases."""
        simulated = self.sim.ended(doc, 0, now / 1000, queued=1)
        verdict = self.real.end("acme", f"d{doc}", self.limits, now_ms=NOW + now)
        return self._compare(simulated, verdict, now)

    def sweep(self, now: int) -> list[int]:
        """A worker's sweep (the simulator's tick): the held documents whose tokens fell due."""
        simulated = self.sim.due(now / 1000)
        verdict = self.real.end("acme", "", self.limits, now_ms=NOW + now)
        return self._compare(simulated, verdict, now)

    def _compare(self, simulated: list[int], verdict: object, now: int) -> list[int]:
        before = len(self.queue.released)
        self.real.release("acme", self.limits, verdict, self.queue, REMEMBER, now_ms=NOW + now)  # type: ignore[arg-type]
        released = [int(t[1:]) for t in self.queue.released[before:]]
        assert released == simulated, (now, released, simulated)
        return released


@pytest.mark.parametrize("seed", range(6))
def test_the_simulators_gate_decides_as_the_real_one(client: redis.Redis, key_prefix: str, seed: int) -> None:
    rng = random.Random(seed)
    for limits in LIMITS:
        costed = limits.max_cost_in_flight is not None
        units = [rng.choice((1, 1, 2, 3)) * ONE if costed else ONE for _ in range(50)]
        both = Both(client, f"{key_prefix}{seed}:{limits.encode()}:", limits, units)
        running: list[int] = []
        coming_back: list[int] = []
        arrived, now, decisions = 0, 0, 0
        while now < SPAN - 1000 and (arrived < len(units) or running or coming_back):
            now += rng.randrange(0, 400)
            action = rng.random()
            if action < 0.4 and arrived < len(units):
                for _ in range(min(rng.randint(1, 4), len(units) - arrived)):  # a burst, at once
                    if both.arrive(arrived, now):
                        running.append(arrived)
                    arrived += 1
            elif action < 0.7 and running:
                coming_back += both.end(running.pop(rng.randrange(len(running))), now)
            elif action < 0.85 and coming_back:
                doc = coming_back.pop(0)
                assert both.arrive(doc, now), "a released document runs when it arrives"
                running.append(doc)
            else:
                coming_back += both.sweep(now)
            decisions += 1
        assert decisions > 50 and both.held and both.queue.released, "the limits held and released"
