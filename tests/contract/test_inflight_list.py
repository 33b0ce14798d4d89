"""One contract for the inflight mode's store, run on fakeredis and on a real Redis."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis
from support.redis_wire import record_sends

from priority_router import PriorityRouter
from priority_router.router import engine_of
from priority_router.store.inflight import InflightCounter, member


@pytest.fixture(params=["fakeredis", pytest.param("redis", marks=pytest.mark.integration)])
def client(request: pytest.FixtureRequest) -> redis.Redis:
    return request.getfixturevalue("fake_redis" if request.param == "fakeredis" else "real_redis")


def make(client: redis.Redis, prefix: str, interval: float = 1500) -> PriorityRouter:
    return PriorityRouter(mode="inflight", redis_client=client, key_prefix=prefix, reset_interval=interval)


def ids(n: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(n)]


def test_publish_lowers_and_end_raises_exactly_once(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    docs = ids(5)
    assert [router.record("acme", d).pending for d in docs] == [0, -1, -2, -3, -4]
    assert router.end("acme", docs[0]) is True
    assert router.end("acme", docs[0]) is False, "a duplicate end changes nothing"
    assert router.peek("acme").pending == -3
    for d in docs[1:]:
        assert router.end("acme", d) is True
    assert router.peek("acme").pending == 0 and router.state("acme").ttl_ms is None
    assert client.exists(engine_of(router).store.key("acme")) == 0, "Redis drops the emptied list"
    assert router.end("acme", docs[1]) is False, "never above nothing in flight"
    assert router.end("acme", "never-published") is False
    assert router.record("acme", "x").pending == 0


def test_a_task_id_published_twice_is_two_messages(client: redis.Redis, key_prefix: str) -> None:
    # Celery runs both messages, so both are pending work, and each run ends one.
    router = make(client, key_prefix)
    assert router.record("acme", "same").pending == 0
    assert router.record("acme", "same").pending == -1
    assert router.end("acme", "same") is True
    assert router.peek("acme").pending == 0, "one of the two is still in flight"
    assert router.end("acme", "same") is True
    assert router.end("acme", "same") is False
    assert client.exists(engine_of(router).store.key("acme")) == 0


def test_ends_in_any_order(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    docs = ids(40)
    for d in docs:
        router.record("acme", d)
    order = docs[::2] + docs[1::2][::-1]
    assert [router.end("acme", d) for d in order] == [True] * 40
    assert router.peek("acme").pending == 0


def test_a_publish_is_one_round_trip_as_a_seed_check(
    client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One ``EVALSHA`` (the script keeps a client's documents in order), one round trip as
    a seed check; the same once tiers are in use (the script reads the tier)."""
    inflight = make(client, key_prefix)
    seed = PriorityRouter(redis_client=client, key_prefix=key_prefix)
    inflight.record("warm", "w")
    seed.record("warm")
    sent = record_sends(client, monkeypatch)

    def commands(payload: list[bytes]) -> list[bytes]:
        # Every command starts with "*<n>\r\n$<len>\r\n<NAME>".
        parts = b"".join(payload).split(b"\r\n")
        return [parts[i + 2].upper() for i, p in enumerate(parts) if p.startswith(b"*")]

    inflight.record("acme", "doc-1")
    seed.record("acme")
    assert len(sent) == 2, "one round trip each"
    assert commands(sent[0]) == [b"EVALSHA"]
    assert commands(sent[1]) == [b"MULTI", b"INCR", b"PEXPIRE", b"EXEC"]
    inflight.set_tier("acme", shift=1)
    seed.set_tier("acme", shift=1)
    sent.clear()
    assert inflight.record("acme", "doc-2").tier == "client: shift=1"
    seed.record("acme")
    assert commands(sent[0]) == [b"EVALSHA"]
    assert commands(sent[1]) == [b"MULTI", b"INCR", b"PEXPIRE", b"GET", b"EXEC"]


def test_every_list_has_the_idle_reset(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix, interval=30)
    docs = ids(30)
    for n, d in enumerate(docs):
        router.record(f"c{n % 4}", d)
    for n, d in enumerate(docs[:10]):
        router.end(f"c{n % 4}", d)
    ttls = [client.pttl(k) for k in client.scan_iter(match=key_prefix + "{*")]
    assert len(ttls) == 8, "each client's list and its order key"
    assert all(0 < ttl <= 30_000 for ttl in ttls)


def test_lost_ends_are_cleared_by_the_idle_reset(client: redis.Redis, key_prefix: str) -> None:
    counter = InflightCounter(client, key_prefix, reset_interval=0.3)
    counter.record("acme", "lost-1")
    counter.record("acme", "lost-2")
    time.sleep(0.45)
    assert counter.record("acme", "next") == 0


def test_concurrent_publishes_and_ends_lose_nothing(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            mine = [f"t{n}-{i}" for i in range(50)]
            for d in mine:
                router.record("shared", d)
            for d in mine:
                assert router.end("shared", d) is True
                assert router.end("shared", d) is False
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert router.peek("shared").pending == 0
    assert client.exists(engine_of(router).store.key("shared")) == 0


def test_entries_are_8_byte_digests() -> None:
    m = member(str(uuid.uuid4()))
    assert isinstance(m, bytes) and len(m) == 8
    assert member("a") != member("b") and member("a") == member("a")
    assert len(member("lone \udc80 surrogate")) == 8


@pytest.mark.integration
def test_entries_are_stored_compactly(real_redis: redis.Redis, key_prefix: str) -> None:
    """Redis keeps an 8-byte entry in 10 bytes, a UUID string in 38: the list stays compact."""
    router = make(real_redis, key_prefix)
    for d in ids(100):
        router.record("acme", d)
    key = engine_of(router).store.key("acme")
    per_entry = (real_redis.memory_usage(key) or 0) / 100
    assert real_redis.llen(key) == 100
    assert per_entry < 20, f"{per_entry:.1f} bytes an entry: entries are not 8 bytes"


def test_a_document_published_while_older_ones_wait_goes_behind_them(
    client: redis.Redis, key_prefix: str
) -> None:
    """The count falls as documents finish, but a new document is checked no lower than the
    client's newest document in flight, so it never goes out more urgent than one waiting."""
    router = make(client, key_prefix)
    docs = ids(30)
    checked = [router.record("acme", d) for d in docs]
    for d in docs[:25]:
        router.end("acme", d)
    assert router.peek("acme").pending == -4, "5 in flight"
    later = router.record("acme", "later")
    assert later.pending == -29 and later.priority == checked[-1].priority == 9
    assert router.record("acme", "after").pending == -29, "and so on, while they are in flight"


def test_once_the_newest_document_finished_the_count_alone_decides(
    client: redis.Redis, key_prefix: str
) -> None:
    router = make(client, key_prefix)
    router.record("acme", "a")
    router.record("acme", "b")
    router.record("acme", "c")
    router.end("acme", "c")  # the newest: "a" and "b", published before it, have started
    assert router.record("acme", "d").pending == -2
    router.end("acme", "a")
    router.end("acme", "b")
    router.end("acme", "d")
    assert router.record("acme", "e").pending == 0


def test_a_provisional_document_never_confirmed_stops_counting_at_the_next_publish(
    client: redis.Redis, key_prefix: str
) -> None:
    # Counted by a publisher killed before its send: no worker will end it (#42).
    lists = InflightCounter(client, key_prefix, 1500, unconfirmed_window=0.2)
    assert lists.count("acme", "lost", provisional=True)[0] == 0
    assert lists.count("acme", "kept", provisional=True)[0] == -1
    assert lists.count("acme", "sent-by-hand")[0] == -2  # not provisional: counted for good
    assert lists.count("acme", "costed", units=3000, costs=True, provisional=True)[0] == -3
    lists.confirm([("acme", "kept", 1000)])
    time.sleep(0.3)
    # "lost" and "costed" (and its 2 extra units) are dropped; "kept", "sent-by-hand" count.
    assert lists.count("acme", "next", costs=True)[0] == -2
    assert lists.read("acme").counted == 3
    for task_id in ("kept", "sent-by-hand", "next"):
        assert lists.end("acme", task_id, costs=True) == 1000
    assert lists.end("acme", "lost") is None and lists.end("acme", "costed", 3000) is None
    assert client.exists(lists.key("acme")) == 0, "nothing left for the idle reset"


def test_a_confirmed_document_counts_until_it_ends_however_long_it_waits(
    client: redis.Redis, key_prefix: str
) -> None:
    lists = InflightCounter(client, key_prefix, 1500, unconfirmed_window=0.1)
    lists.count("acme", "waits", provisional=True)
    lists.confirm([("acme", "waits", 1000), ("other", "never-counted", 1000)])
    time.sleep(0.2)
    assert lists.count("acme", "later", provisional=True)[0] == -1
    assert lists.end("acme", "waits") == 1000
    lists.confirm([("acme", "waits", 1000)])  # a confirm after the end changes nothing
    assert lists.read("acme").counted == 1
    assert lists.clear("acme") and client.exists(f"{lists.key('acme')[:-2]}:u") == 0


def test_a_provisional_publish_is_still_one_round_trip_and_its_confirm_goes_later(
    client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    router = make(client, key_prefix)
    engine = engine_of(router)
    engine.decide("warm", "w", provisional=True)
    sent = record_sends(client, monkeypatch)
    assert engine.decide("acme", "doc", provisional=True).pending == 0
    assert len(sent) == 1 and b"EVALSHA" in b"".join(sent[0]).upper()
    monkeypatch.undo()
    engine.confirm_quietly("acme", "doc")
    unconfirmed = f"{engine.store.key('acme')[:-2]}:u"
    assert client.zcard(unconfirmed) == 1
    engine.send_confirms_quietly()
    assert client.exists(unconfirmed) == 0
    assert router.state("acme").counted == 1
