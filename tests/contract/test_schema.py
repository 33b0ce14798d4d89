"""The store's schema marker, on fakeredis and on a real Redis: a router adopts a store laid
out by 0.1.0, and refuses, loudly and once, a store another release laid out."""

from __future__ import annotations

import logging

import pytest
import redis

from priority_router import CounterUnavailable, PriorityRouter
from priority_router.decision import Reason
from priority_router.router import engine_of
from priority_router.store import schema
from priority_router.store.client_ids import client_key, inflight_key, tier_key
from priority_router.store.inflight import member
from priority_router.store.schema import SCHEMA, SchemaMismatch, schema_key


@pytest.fixture(params=["fakeredis", pytest.param("redis", marks=pytest.mark.integration)])
def client(request: pytest.FixtureRequest) -> redis.Redis:
    return request.getfixturevalue("fake_redis" if request.param == "fakeredis" else "real_redis")


def test_the_first_router_marks_the_store(client: redis.Redis, key_prefix: str) -> None:
    PriorityRouter(redis_client=client, key_prefix=key_prefix).record("acme")
    assert client.get(schema_key(key_prefix)) == str(SCHEMA).encode()


def test_reading_marks_nothing_and_the_first_write_marks_the_store(
    client: redis.Redis, key_prefix: str
) -> None:
    router = PriorityRouter(redis_client=client, key_prefix=key_prefix)
    router.peek("acme"), router.state("acme"), router.tier("acme"), router.tiers()
    router.limits("acme"), router.gate_state("acme"), router.default_tier()
    assert client.get(schema_key(key_prefix)) is None  # inspect, status and doctor only read
    router.record("acme")
    assert client.get(schema_key(key_prefix)) == str(SCHEMA).encode()


def test_reading_still_refuses_a_store_of_another_schema(client: redis.Redis, key_prefix: str) -> None:
    client.set(schema_key(key_prefix), "2")
    with pytest.raises(SchemaMismatch):
        PriorityRouter(redis_client=client, key_prefix=key_prefix).peek("acme")


def test_a_store_laid_out_by_0_1_0_is_adopted_with_its_counts_and_tiers(
    client: redis.Redis, key_prefix: str
) -> None:
    # What 0.1.0 left: no marker, a seed counter of six documents (1,000 s left of its idle
    # reset), an in-flight list of two documents and a tier.
    client.set(client_key(key_prefix, "acme"), 6, px=1_000_000)
    client.lpush(inflight_key(key_prefix, "busy"), member("t1"), member("t2"))
    client.pexpire(inflight_key(key_prefix, "busy"), 1_000_000)
    client.set(tier_key(key_prefix, "vip"), "f=1")
    client.set(f"{key_prefix}tiers-in-use", 1)

    seed = PriorityRouter(redis_client=client, key_prefix=key_prefix)
    inflight = PriorityRouter(redis_client=client, key_prefix=key_prefix, mode="inflight")

    assert seed.record("acme").pending == -6
    assert inflight.record("busy", task_id="t3").pending == -2
    assert inflight.end("busy", "t1") is True
    assert seed.record("vip").priority == 1
    assert client.get(schema_key(key_prefix)) == b"1"


def test_a_store_of_another_schema_is_refused_and_publishes_fail_open(
    client: redis.Redis, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    client.set(schema_key(key_prefix), "2")
    client.set(client_key(key_prefix, "acme"), "a value schema 2 gave another meaning")
    router = PriorityRouter(redis_client=client, key_prefix=key_prefix, default_priority=5)

    with caplog.at_level(logging.ERROR, "priority_router"):
        decisions = [router.decide("acme") for _ in range(3)]
        many = router.decide_many("acme", 2)

    assert {(d.priority, d.reason) for d in [*decisions, *many]} == {(5, Reason.FAIL_OPEN)}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert "schema 2" in errors[0] and f"reads schema {SCHEMA} only" in errors[0]
    assert "new key_prefix" in errors[0]
    assert client.get(client_key(key_prefix, "acme")) == b"a value schema 2 gave another meaning"
    assert client.get(schema_key(key_prefix)) == b"2"


def test_explicit_calls_on_another_schema_raise_a_clear_error(client: redis.Redis, key_prefix: str) -> None:
    client.set(schema_key(key_prefix), "0")
    router = PriorityRouter(redis_client=client, key_prefix=key_prefix, mode="inflight")

    with pytest.raises(SchemaMismatch, match=r"schema 0.*Fix: give this release a store of its own"):
        router.record("acme", task_id="t1")
    with pytest.raises(SchemaMismatch):
        router.peek("acme")
    with pytest.raises(SchemaMismatch):
        router.set_tier("acme", weight=2)
    assert engine_of(router).end_quietly("acme", "t1") is False
    assert not client.exists(inflight_key(key_prefix, "acme"), tier_key(key_prefix, "acme"))


def test_a_flushed_store_is_marked_again_at_the_next_check(
    client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    router = PriorityRouter(redis_client=client, key_prefix=key_prefix)
    router.record("acme")
    client.delete(schema_key(key_prefix))
    monkeypatch.setattr(schema, "RECHECK_SECONDS", 0.0)

    router.record("acme")

    assert client.get(schema_key(key_prefix)) == b"1"


def test_the_marker_costs_one_round_trip_per_recheck_not_per_publish(
    client: redis.Redis, key_prefix: str
) -> None:
    router = PriorityRouter(redis_client=client, key_prefix=key_prefix)
    router.record("acme")
    client.set(schema_key(key_prefix), "2")  # within RECHECK_SECONDS nothing reads it again

    assert router.record("acme").pending == -1


def test_a_store_that_cannot_answer_is_an_outage_not_a_schema(key_prefix: str) -> None:
    router = PriorityRouter("redis://127.0.0.1:1/0", key_prefix=key_prefix, connect_timeout=0.2)
    with pytest.raises(CounterUnavailable):
        router.record("acme")
    assert router.decide("acme").reason is Reason.LOCAL
