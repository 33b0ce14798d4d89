"""One contract for the counter, run on fakeredis and on a real Redis.

fakeredis only emulates Redis, so every behaviour is checked on the real server too.
"""

from __future__ import annotations

import threading
import time
from collections import Counter as Multiset

import pytest
import redis
from support.redis_wire import record_sends, send_cut_before_exec

from priority_router import DEFAULT_THRESHOLDS, CounterUnavailable, PriorityRouter
from priority_router.router import engine_of
from priority_router.store.counter import Counter
from priority_router.store.schema import schema_key


@pytest.fixture(params=["fakeredis", pytest.param("redis", marks=pytest.mark.integration)])
def client(request: pytest.FixtureRequest) -> redis.Redis:
    return request.getfixturevalue("fake_redis" if request.param == "fakeredis" else "real_redis")


def make(client: redis.Redis, prefix: str, interval: float = 1500) -> PriorityRouter:
    return PriorityRouter(redis_client=client, key_prefix=prefix, reset_interval=interval)


def test_first_document_is_checked_at_zero(client: redis.Redis, key_prefix: str) -> None:
    decision = make(client, key_prefix).record("acme")
    assert (decision.client_id, decision.pending, decision.priority) == ("acme", 0, 1)


def test_worked_example(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    got = [router.record("acme").priority for _ in range(23)]
    assert got == [1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 8, 8, 8, 8, 9, 9]
    assert router.peek("acme").pending == -22


def test_clients_are_independent(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    for _ in range(10):
        router.record("heavy")
    assert router.record("light").pending == 0
    assert router.peek("heavy").pending == -9


# The reset's timing is the counter's: sub-second intervals (refused by the router's
# configuration) keep these tests fast.


def test_reset_after_more_than_interval_idle(client: redis.Redis, key_prefix: str) -> None:
    counter = Counter(client, key_prefix, reset_interval=0.3)
    counter.record("acme")
    counter.record("acme")
    time.sleep(0.45)
    assert counter.record("acme") == 0


def test_each_check_rearms_the_reset(client: redis.Redis, key_prefix: str) -> None:
    # The interval counts from the last update, not from the first document.
    counter = Counter(client, key_prefix, reset_interval=0.4)
    counter.record("acme")
    for expected in (-1, -2, -3):
        time.sleep(0.2)
        assert counter.record("acme") == expected


def test_idle_clients_keys_expire(client: redis.Redis, key_prefix: str) -> None:
    counter = Counter(client, key_prefix, reset_interval=0.2)
    counter.record("gone")
    assert 0 < client.pttl(counter.key("gone")) <= 200
    time.sleep(0.35)
    assert client.exists(counter.key("gone")) == 0


def test_router_reset_interval_is_the_keys_ttl(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix, interval=2)
    router.record("acme")
    assert 1500 < client.pttl(engine_of(router).counter.key("acme")) <= 2000


def test_peek_does_not_count(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    assert router.peek("new").pending == 0
    router.record("new")
    router.record("new")
    assert router.peek("new").pending == -1
    assert router.peek("new").pending == -1
    assert router.record("new").pending == -2


def test_reset_clears_one_client(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    for _ in range(5):
        router.record("a")
    router.record("b")
    assert router.reset("a") is True
    assert router.reset("a") is False
    assert router.record("a").pending == 0
    assert router.peek("b").pending == 0


def test_scan_lists_every_tracked_client(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    ids = [f"c{i}" for i in range(1200)] + ["odd:{id}*", "x" * 500]
    for cid in ids:
        router.record(cid)
    router.record("c7")
    states = {s.client_id: s for s in engine_of(router).counter.scan()}
    assert len(states) == len(ids)
    assert states["c7"].pending == -1
    assert states["odd:{id}*"].pending == 0
    assert engine_of(router).counter.clear_all() == len(ids)
    assert list(engine_of(router).counter.scan()) == []


def test_concurrent_checks_lose_no_update(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    results: list[int] = []
    lock = threading.Lock()

    def publish() -> None:
        for _ in range(150):
            d = router.record("shared")
            with lock:
                results.append(d.priority)

    threads = [threading.Thread(target=publish) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert router.peek("shared").pending == -599
    sequential = [DEFAULT_THRESHOLDS.priority_for(1 - n) for n in range(1, 601)]
    assert Multiset(results) == Multiset(sequential)


def test_bad_client_ids_are_value_errors(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    for bad in (None, "", "  ", [], {}):
        with pytest.raises(ValueError, match="not a client id"):
            router.record(bad)


def test_unreachable_store_raises_counter_unavailable(key_prefix: str) -> None:
    router = PriorityRouter(redis_url="redis://127.0.0.1:1/0", key_prefix=key_prefix)
    with pytest.raises(CounterUnavailable):
        router.record("acme")
    decision = router.decide("acme")
    assert (decision.pending, decision.priority, decision.reason.value) == (0, 1, "local")


def test_record_many_gives_the_decisions_of_sequential_records(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    router.record("one-by-one")
    router.record("batched")
    sequential = [router.record("one-by-one") for _ in range(30)]
    batched = router.record_many("batched", 30)
    assert [(d.pending, d.priority) for d in batched] == [(d.pending, d.priority) for d in sequential]
    assert [d.priority for d in batched[:4]] == [1, 1, 2, 2]
    assert router.peek("batched").pending == -30
    assert router.record("batched").pending == -31
    assert 1_400_000 < client.pttl(engine_of(router).counter.key("batched")) <= 1_500_000


def test_record_many_of_nothing_counts_nothing(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    assert router.record_many("idle", 0) == []
    assert client.exists(engine_of(router).counter.key("idle")) == 0
    for bad in (-1, 2.5, True, "3"):
        with pytest.raises(ValueError, match="batch size"):
            router.record_many("idle", bad)  # type: ignore[arg-type]


def test_a_check_is_one_round_trip(
    client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    router = make(client, key_prefix)
    router.record("warm")
    sent = record_sends(client, monkeypatch)
    router.record("acme")
    assert len(sent) == 1
    router.record_many("acme", 1000)
    assert len(sent) == 2


def test_a_failed_check_leaves_the_connection_usable(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    client.rpush(engine_of(router).counter.key("listy"), "not a count")
    with pytest.raises(CounterUnavailable, match="listy"):
        router.record("listy")
    with pytest.raises(CounterUnavailable):
        router.record_many("listy", 3)
    # No reply of the failed transaction is left for the next command to read.
    assert [router.record("after").pending for _ in range(3)] == [0, -1, -2]
    assert client.ping() is True
    assert client.type(engine_of(router).counter.key("listy")) in (b"list", "list")


def test_no_key_is_left_without_expiry(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix, interval=30)
    for n in range(50):
        router.record(f"c{n % 7}")
    router.record_many("bulk", 40)
    # The schema marker says how the store is laid out, and outlives the counts.
    marker = schema_key(key_prefix).encode()
    ttls = [client.pttl(key) for key in client.scan_iter(match=key_prefix + "*") if key != marker]
    assert len(ttls) == 8
    assert all(0 < ttl <= 30_000 for ttl in ttls)


@pytest.mark.integration
def test_a_check_cut_off_before_exec_changes_nothing(real_redis: redis.Redis, key_prefix: str) -> None:
    """The whole check is one MULTI ... EXEC: a publisher that dies mid-send leaves no key,
    so never one without its expiry."""
    from priority_router.store.packed import PackedCheck, exchange_for

    key = Counter(real_redis, key_prefix, 1500).key("cut")
    exchange = exchange_for(real_redis)
    assert exchange is not None
    send_cut_before_exec(real_redis, PackedCheck(exchange, 1_500_000)._pack(key, 1)[0])
    time.sleep(0.05)
    assert real_redis.exists(key) == 0
