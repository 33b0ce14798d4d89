"""While the counter store fails, each publishing process prices its publishes by its own
count of each client (``local_counts.py``): a giant's burst still sinks, light clients stay
most urgent, and the store's counts are the store's again once it answers."""

from __future__ import annotations

import time

import fakeredis
import pytest

from priority_router import PriorityRouter, Reason
from priority_router.local_counts import LocalCounts
from priority_router.router import engine_of

#: The scheme's table for a burst of 25 from 0 (SPEC.md's worked example).
SINKING = [1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7] + [8] * 6 + [9] * 4


def decided_by_store(router: PriorityRouter, client: str, timeout: float = 5) -> None:
    """Wait until a probe has found the store answering and a publish is counted again."""
    deadline = time.monotonic() + timeout
    while router.decide(client).reason is not Reason.COUNTED:
        assert time.monotonic() < deadline, "the store was not used again"
        time.sleep(0.02)


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


@pytest.fixture
def router(server: fakeredis.FakeServer) -> PriorityRouter:
    return PriorityRouter(redis_client=fakeredis.FakeRedis(server=server), cooldown=0.1)


def test_an_outage_goes_on_from_the_stores_count_and_the_store_goes_on_from_its_own(
    router: PriorityRouter, server: fakeredis.FakeServer
) -> None:
    counted = [router.decide("giant") for _ in range(10)]
    assert {d.reason for d in counted} == {Reason.COUNTED}
    server.connected = False
    during = [router.decide("giant") for _ in range(15)]
    light = [router.decide(f"light{n}") for n in range(3)]
    assert {d.reason for d in during + light} == {Reason.LOCAL}
    assert [d.priority for d in counted + during] == SINKING
    assert [d.pending for d in during] == [-n for n in range(10, 25)]
    assert [(d.pending, d.priority) for d in light] == [(0, 1)] * 3

    server.connected = True
    decided_by_store(router, "light0")
    # The store did not see the outage's documents, and nothing is sent to it twice: the
    # giant goes on from the store's count (10 documents, then this one).
    assert router.decide("giant").pending == -10
    assert router.peek("giant").pending == -10


def test_each_publishing_process_counts_only_its_own_share(server: fakeredis.FakeServer) -> None:
    one, two = (PriorityRouter(redis_client=fakeredis.FakeRedis(server=server)) for _ in range(2))
    for _ in range(5):
        one.decide("giant")
        two.decide("giant")
    server.connected = False
    # Each goes on from the count its own last publish was checked at (-8, -9), then alone.
    assert [one.decide("giant").pending for _ in range(3)] == [-9, -10, -11]
    assert [two.decide("giant").pending for _ in range(3)] == [-10, -11, -12]
    assert two.decide("light").priority == 1


def test_a_batch_and_costs_count_here_as_in_the_store(
    router: PriorityRouter, server: fakeredis.FakeServer
) -> None:
    router.decide("acme", cost=2.5)
    server.connected = False
    assert [d.pending for d in router.decide_many("acme", 3, cost=2)] == [-2.5, -4.5, -6.5]
    assert router.decide("acme").pending == -8.5


def test_a_clients_own_tier_and_the_default_tier_still_apply(
    router: PriorityRouter, server: fakeredis.FakeServer
) -> None:
    router.set_tier("paying", weight=4)
    router.set_default_tier(fixed=8)
    engine_of(router).tier_store.refresh = 0
    assert router.decide("paying").tier == "client: weight=4"
    assert router.decide("free").priority == 8
    server.connected = False
    during = [router.decide("paying") for _ in range(10)]
    assert [(d.priority, d.tier) for d in during][-1] == (1, "client: weight=4")  # -10 / 4
    new = router.decide("new")
    assert (new.priority, new.tier, new.reason) == (8, "default: fixed=8", Reason.LOCAL)


def test_a_quiet_client_starts_again_from_0_and_the_least_recent_client_goes_first() -> None:
    now = [0.0]
    counts = LocalCounts(reset_interval=100, limit=3, clock=lambda: now[0])
    counts.counted("giant", -40, None)
    assert counts.count("giant", 1, 2)[0] == [-40, -41]
    now[0] = 142.0  # the giant's last was at 0 + 100 s idle: reset
    assert counts.count("giant", 1)[0] == [0]
    for client in ("a", "b", "c"):
        counts.count(client, 1, 5)
    assert len(counts) == 3
    assert counts.count("giant", 1)[0] == [0], "dropped, the least recently used"
    assert counts.count("b", 1)[0] == [-5]
