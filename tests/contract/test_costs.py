"""A cost per document, on fakeredis and on a real Redis: each document is checked at minus
the costs before it and lowers the count by its own; with every cost 1, the seed exactly."""

from __future__ import annotations

import logging
import math
import uuid

import pytest
import redis
from support.redis_wire import record_sends

from priority_router import PriorityRouter
from priority_router.decision import Reason
from priority_router.router import engine_of
from priority_router.store.costs import InvalidCost, costs_in_use_key


@pytest.fixture(params=["fakeredis", pytest.param("redis", marks=pytest.mark.integration)])
def client(request: pytest.FixtureRequest) -> redis.Redis:
    return request.getfixturevalue("fake_redis" if request.param == "fakeredis" else "real_redis")


def make(client: redis.Redis, prefix: str, **settings: object) -> PriorityRouter:
    return PriorityRouter(redis_client=client, key_prefix=prefix, **settings)


def ids(n: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(n)]


def test_each_document_is_checked_at_minus_the_costs_before_it(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    got = [router.record("scans", cost=c) for c in (30, 1, 2.5, 1, 0.25)]
    assert [d.pending for d in got] == [0, -30, -31, -33.5, -34.5]
    assert [d.cost for d in got] == [30, 1, 2.5, 1, 0.25]
    # Fractions are truncated toward 0 for the table: -33.5 is -33, under -20: priority 9.
    assert got[0].priority == 1 and got[3].priority == 9
    state = router.state("scans")
    assert (state.counted, state.pending) == (34.75, -33.75)


def test_a_first_document_however_large_is_checked_at_zero(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    assert router.record("big", cost=10_000).pending == 0
    assert router.record("small").pending == 0


def test_with_every_cost_one_the_seed_is_unchanged(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    router.record("costed-elsewhere", cost=3)  # costs are in use under the prefix from now on
    got = [router.record("acme", cost=1).priority for _ in range(23)]
    assert got == [1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 8, 8, 8, 8, 9, 9]
    assert router.peek("acme").pending == -22


def test_a_tier_weight_divides_the_counted_cost(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    router.set_tier("vip", weight=4)
    router.record("vip", cost=20)
    # Checked at -20; divided by 4: -5, priority 3 (under -4).
    assert router.record("vip").priority == 3


def test_record_many_with_a_cost_is_that_many_records(client: redis.Redis, key_prefix: str) -> None:
    one = make(client, key_prefix + "one:")
    many = make(client, key_prefix + "many:")
    one.record("acme", cost=2)
    many.record("acme", cost=2)
    singles = [one.record("acme", cost=1.5) for _ in range(6)]
    assert many.record_many("acme", 6, cost=1.5) == singles
    assert many.decide_many("acme", 2, cost=1.5) == [one.record("acme", cost=1.5) for _ in range(2)]


def test_batch_counts_each_reserved_document_at_its_cost(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    with router.batch("acme", 3, cost=4) as reserved:
        decisions = [reserved.take("acme") for _ in range(3)]
    assert [(d.pending, d.cost) for d in decisions if d is not None] == [(0, 4), (-4, 4), (-8, 4)]


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, 2e6, "many", True, None, 1e-5])
def test_a_bad_cost_is_a_clear_error_and_counts_nothing(
    client: redis.Redis, key_prefix: str, bad: object
) -> None:
    router = make(client, key_prefix, mode="inflight")
    with pytest.raises(InvalidCost, match="cost"):
        router.record("acme", "t1", cost=bad)  # type: ignore[arg-type]
    if bad is not None:  # end() without a cost ends at the cost the document was counted with
        with pytest.raises(InvalidCost):
            router.end("acme", "t1", cost=bad)  # type: ignore[arg-type]
    assert router.state("acme").ttl_ms is None


def test_a_bad_cost_on_a_publish_is_logged_once_and_counted_as_one(
    client: redis.Redis, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    router = make(client, key_prefix)
    with caplog.at_level(logging.ERROR, "priority_router"):
        decisions = [router.decide("acme", cost=-3) for _ in range(3)]
    assert [(d.pending, d.cost, d.reason) for d in decisions] == [
        (0, 1, Reason.COUNTED),
        (-1, 1, Reason.COUNTED),
        (-2, 1, Reason.COUNTED),
    ]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "'acme'" in errors[0] and "counted as 1" in errors[0]


def test_inflight_gives_back_exactly_each_cost_once_in_any_order(
    client: redis.Redis, key_prefix: str
) -> None:
    router = make(client, key_prefix, mode="inflight")
    docs = ids(4)
    costs = [30, 1, 2.5, 0.5]
    checked = [router.record("acme", d, cost=c).pending for d, c in zip(docs, costs, strict=True)]
    assert checked == [0, -30, -31, -33.5]

    assert router.end("acme", docs[2], cost=2.5) is True
    assert router.end("acme", docs[2], cost=2.5) is False  # a duplicate end gives nothing back
    assert router.end("acme", docs[0], cost=30) is True
    assert router.state("acme").counted == 1.5
    # Checked behind the newest document in flight (docs[3], at -33.5): it keeps its order.
    assert router.record("acme", ids(1)[0]).pending == -33.5
    for d, c in ((docs[3], 0.5), (docs[1], 1)):
        assert router.end("acme", d, cost=c) is True
    assert router.state("acme").counted == 1  # the document just recorded


def test_inflight_end_without_a_cost_ends_a_costed_document(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix, mode="inflight")
    router.record("c", "t1", cost=30)
    assert router.record("c", "t2").pending == -30
    assert router.end("c", "t1") is True
    assert router.state("c").counted == 1, "the 30 went back, t2 is still in flight"
    assert router.end("c", "t1") is False, "once"
    assert router.end("c", "t2") is True
    assert not client.exists(engine_of(router).store.key("c"))
    assert router.record("c", "t3").pending == 0


def test_inflight_end_with_a_wrong_cost_ends_at_the_counted_cost_and_says_so(
    client: redis.Redis, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    router = make(client, key_prefix, mode="inflight")
    router.record("c", "t1", cost=30)
    router.record("c", "t2", cost=2.5)
    router.record("c", "t3")
    with caplog.at_level(logging.WARNING, logger="priority_router"):
        assert router.end("c", "t1", cost=3) is True
        assert router.end("c", "t3", cost=7) is True  # counted at 1
    assert router.state("c").counted == 2.5
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "'t1' of client 'c' was counted at cost 30, and its end gave cost 3" in warnings[0]
    assert "counted at cost 1, and its end gave cost 7" in warnings[1]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="priority_router"):
        assert router.end("c", "t2", cost=2.5) is True
    assert not caplog.records, "the right cost says nothing"
    assert router.state("c").pending == 0


def test_a_worker_end_with_a_wrong_cost_says_so_once_per_client(
    client: redis.Redis, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    router = make(client, key_prefix, mode="inflight")
    for task in ("t1", "t2"):
        router.record("c", task, cost=4)
    with caplog.at_level(logging.WARNING, logger="priority_router"):
        assert engine_of(router).end_quietly("c", "t1", "2") is True
        assert engine_of(router).end_quietly("c", "t2", "2") is True
        assert engine_of(router).end_quietly("c", "t2", "2") is False
    assert router.state("c").pending == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "counted at cost 4, and its end gave cost 2" in warnings[0]


def test_inflight_end_finds_a_costed_document_behind_many_others(
    client: redis.Redis, key_prefix: str
) -> None:
    router = make(client, key_prefix, mode="inflight")
    router.record("c", "old", cost=5)
    newer = ids(600)  # more than one of the script's chunks of the list
    for task in newer:
        router.record("c", task)
    assert router.end("c", "old") is True
    assert router.state("c").counted == 600
    assert router.end("c", newer[0], cost=9) is True  # counted at 1
    assert router.state("c").counted == 599


def test_an_end_before_this_process_saw_costs_in_use_still_ends_a_costed_document(
    client: redis.Redis, key_prefix: str
) -> None:
    worker = make(client, key_prefix, mode="inflight")
    worker.record("warm", "w")  # reads the costs marker: none yet, kept for a few seconds
    make(client, key_prefix, mode="inflight").record("c", "t1", cost=30)
    assert worker.end("c", "t1") is True
    assert worker.state("c").pending == 0


def test_inflight_count_is_zero_exactly_once_everything_ended(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix, mode="inflight")
    docs = ids(6)
    for n, d in enumerate(docs):
        router.record("acme", d, cost=0.001 + n * 1.7)
    for n, d in reversed(list(enumerate(docs))):
        router.end("acme", d, cost=0.001 + n * 1.7)
    assert router.state("acme").pending == 0 and router.state("acme").ttl_ms is None
    assert not client.exists(engine_of(router).store.key("acme"))
    assert router.record("acme", ids(1)[0]).pending == 0


def test_reset_and_reset_all_clear_the_costs_too(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    router.record("a", cost=5)
    router.record("b", cost=5)
    assert router.reset("a") is True
    assert router.record("a").pending == 0
    assert engine_of(router).store.clear_all() == 3  # b's count and extras, a's count
    assert router.record("b").pending == 0


@pytest.mark.integration
def test_round_trips_and_commands_by_cost(
    real_redis: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = real_redis
    seed = make(client, key_prefix)
    seed.record("warm")  # the store's schema, read once per process
    sent = record_sends(client, monkeypatch)

    def commands(payload: list[bytes]) -> list[bytes]:
        parts = b"".join(payload).split(b"\r\n")
        return [parts[i + 2].upper() for i, p in enumerate(parts) if p.startswith(b"*")]

    seed.record("acme")
    assert [commands(s) for s in sent] == [[b"MULTI", b"INCR", b"PEXPIRE", b"EXEC"]], "uncosted: as before"
    sent.clear()
    seed.record("acme", cost=3)
    assert commands(sent[-1]) == [b"MULTI", b"INCR", b"PEXPIRE", b"INCRBY", b"PEXPIRE", b"EXEC"]
    assert len(sent) == 2, "the costs-in-use marker once, then one round trip"
    assert client.exists(costs_in_use_key(key_prefix))
    sent.clear()
    seed.record("acme", cost=3)
    seed.record("acme")
    assert len(sent) == 2, "one round trip each"
    assert commands(sent[1]) == [b"MULTI", b"INCR", b"PEXPIRE", b"GET", b"PEXPIRE", b"EXEC"]


def test_other_publishers_read_the_costs_once_they_are_in_use(client: redis.Redis, key_prefix: str) -> None:
    costed = make(client, key_prefix)
    other = make(client, key_prefix)
    other.record("warm")
    costed.record("acme", cost=10)
    engine_of(other).costs_in_use._read_until = 0  # its next read of the marker is due
    assert other.record("acme").pending == -10


def test_inflight_counted_cost_is_the_costs_in_flight_under_any_interleaving(
    client: redis.Redis, key_prefix: str
) -> None:
    import random

    rng = random.Random(20261201)
    router = make(client, key_prefix, mode="inflight")
    in_flight: dict[str, float] = {}
    ended: list[tuple[str, float]] = []
    newest = ("", 0.0)  # the newest document and the costs it was checked behind
    for step in range(400):
        roll = rng.random()
        if roll < 0.45 or not in_flight:
            task, cost = f"t{step}", rng.choice([1, 1, 0.5, 2.5, 30, 0.001, 7.25])
            behind = round(sum(in_flight.values()), 3)
            if newest[0] in in_flight:  # it keeps its order behind the newest in flight
                behind = max(behind, newest[1])
            assert router.record("acme", task, cost=cost).pending == pytest.approx(-behind)
            in_flight[task] = cost
            newest = (task, behind)
        elif roll < 0.85:
            task = rng.choice(sorted(in_flight))
            assert router.end("acme", task, cost=in_flight[task]) is True
            ended.append((task, in_flight.pop(task)))
        else:  # a duplicate or redelivered end gives nothing back
            task, cost = rng.choice(ended) if ended else ("never", 1.0)
            assert router.end("acme", task, cost=cost) is False
        assert router.state("acme").counted == pytest.approx(round(sum(in_flight.values()), 3))
    for task, cost in list(in_flight.items()):
        router.end("acme", task, cost=cost)
    assert router.state("acme").ttl_ms is None and not client.exists(engine_of(router).store.key("acme"))


@pytest.mark.integration
def test_a_costed_inflight_publish_and_end_are_one_round_trip_each(
    real_redis: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    router = make(real_redis, key_prefix, mode="inflight")
    router.record("warm", "w1", cost=2)  # the schema, the costs marker and the scripts, once
    router.end("warm", "w1", cost=2)
    sent = record_sends(real_redis, monkeypatch)

    router.record("acme", "t1", cost=2.5)
    router.record("acme", "t2")
    router.end("acme", "t1", cost=2.5)
    router.end("acme", "t2")

    assert len(sent) == 4, sent


@pytest.mark.parametrize("mode", ["seed", "inflight"])
def test_a_fractional_count_is_never_read_as_a_positive_pending(
    client: redis.Redis, key_prefix: str, mode: str
) -> None:
    """The state took the last document's cost as 1: one document of cost 0.31 read as
    pending +0.69 (``status`` showed it, and in flight 0.31000000000000005)."""
    router = make(client, key_prefix, mode=mode)
    assert router.record("light", ids(1)[0], cost=0.31).pending == 0
    state = router.state("light")
    assert (state.pending, state.counted) == (0, 0.31)
    assert router.peek("light").pending == 0
    router.record("light", ids(1)[0], cost=0.5)
    assert (router.state("light").pending, router.state("light").counted) == (0, 0.81)
