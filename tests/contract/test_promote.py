"""The max_wait promotion script (``lua/promote.lua``) on a real Redis, with kombu's own lists."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter as Multiset
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Producer, Queue
from support.services import broker_db_url

from priority_router import headers as H
from priority_router.integration.starvation import Promoter, queue_lists

pytestmark = pytest.mark.integration

STEPS = list(range(10))


@pytest.fixture
def queue() -> str:
    return f"promote-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def r(redis_server_url: str, queue: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(broker_db_url(redis_server_url))
    yield client
    keys = client.keys(f"*{queue}*")
    if keys:
        client.delete(*keys)
    client.close()


def redis_now(r: redis.Redis) -> float:
    seconds, micros = r.time()
    return float(seconds) + micros / 1e6


def keys_of(queue: str) -> list[str]:
    return [queue] + [f"{queue}\x06\x16{n}" for n in STEPS[1:]]


def message(doc: str, published_at: float | None, **extra: Any) -> str:
    headers: dict[str, Any] = {"id": doc}
    if published_at is not None:
        headers[H.PUBLISHED_AT] = published_at
    return json.dumps({"body": "e30=", "headers": headers, "properties": {"priority": 0}, **extra})


def push(r: redis.Redis, queue: str, step: int, doc: str, published_at: float | None) -> None:
    r.lpush(keys_of(queue)[step], message(doc, published_at))  # as kombu's _put does


def pop_order(r: redis.Redis, queue: str) -> list[str]:
    """Every message in the order kombu's worker takes them (BRPOP over the steps)."""
    order = []
    while True:
        popped = r.brpop(keys_of(queue), timeout=0.01)
        if popped is None:
            return order
        order.append(json.loads(popped[1])["headers"]["id"])


def test_overdue_documents_go_first_oldest_first(r: redis.Redis, queue: str) -> None:
    now = redis_now(r)
    push(r, queue, 9, "old-9", now - 50)
    push(r, queue, 5, "older-5", now - 60)
    push(r, queue, 9, "young-9", now)
    push(r, queue, 5, "mid-5", now - 20)
    push(r, queue, 1, "fresh-1a", now)
    push(r, queue, 1, "fresh-1b", now)
    push(r, queue, 3, "oldest-3", now - 70)

    moved = Promoter(r, max_wait=10).promote(keys_of(queue))

    assert moved == 4
    assert pop_order(r, queue) == ["oldest-3", "older-5", "old-9", "mid-5", "fresh-1a", "fresh-1b", "young-9"]


def test_promoted_documents_stay_in_publish_order_across_sweeps(r: redis.Redis, queue: str) -> None:
    now = redis_now(r)
    push(r, queue, 8, "a", now - 30)
    promoter = Promoter(r, max_wait=10)
    assert promoter.promote(keys_of(queue)) == 1
    push(r, queue, 2, "b", now - 20)  # published later than a, overdue later
    assert promoter.promote(keys_of(queue)) == 1
    assert pop_order(r, queue) == ["a", "b"]


def test_young_documents_and_documents_without_a_publish_time_stay(r: redis.Redis, queue: str) -> None:
    now = redis_now(r)
    push(r, queue, 4, "young", now - 1)
    push(r, queue, 6, "no-header", None)
    r.lpush(keys_of(queue)[7], "not json")
    r.lpush(keys_of(queue)[8], json.dumps({"headers": {H.PUBLISHED_AT: None}}))
    r.lpush(keys_of(queue)[8], message("behind-null", now - 100))
    before = {k: r.lrange(k, 0, -1) for k in keys_of(queue)}

    assert Promoter(r, max_wait=10).promote(keys_of(queue)) == 0
    assert {k: r.lrange(k, 0, -1) for k in keys_of(queue)} == before


def test_batches_move_everything_overdue(r: redis.Redis, queue: str) -> None:
    now = redis_now(r)
    for n in range(25):
        push(r, queue, 1 + n % 9, f"d{n:02d}", now - 100 + n)
    assert Promoter(r, max_wait=10, batch=4).promote(keys_of(queue)) == 25
    assert pop_order(r, queue) == [f"d{n:02d}" for n in range(25)]


def test_many_sweepers_producers_and_consumers_lose_and_copy_nothing(r: redis.Redis, queue: str) -> None:
    keys = keys_of(queue)
    stop = threading.Event()
    produced: list[str] = []
    consumed: list[str] = []
    errors: list[BaseException] = []

    def guarded(fn: Any) -> Any:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        return run

    def producer(n: int) -> None:
        client = redis.Redis(connection_pool=r.connection_pool)
        for i in range(400):
            doc = f"p{n}-{i}"
            age = 100 if i % 2 else 0  # half overdue, half fresh
            client.lpush(keys[1 + i % 9], message(doc, time.time() - age))
            produced.append(doc)

    def sweeper() -> None:
        promoter = Promoter(redis.Redis(connection_pool=r.connection_pool), max_wait=5, batch=7)
        while not stop.is_set():
            promoter.promote(keys)

    def consumer() -> None:
        client = redis.Redis(connection_pool=r.connection_pool)
        while not stop.is_set():
            popped = client.brpop(keys, timeout=0.05)
            if popped is not None:
                consumed.append(json.loads(popped[1])["headers"]["id"])

    sweepers = [threading.Thread(target=guarded(sweeper)) for _ in range(4)]
    consumers = [threading.Thread(target=guarded(consumer)) for _ in range(2)]
    producers = [threading.Thread(target=guarded(lambda n=n: producer(n))) for n in range(3)]
    for thread in sweepers + consumers + producers:
        thread.start()
    for thread in producers:
        thread.join(60)
    deadline = time.monotonic() + 30
    while len(consumed) < len(produced) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for thread in sweepers + consumers:
        thread.join(10)

    assert not errors
    assert len(produced) == 1200
    assert Multiset(consumed) == Multiset(produced), "a message was lost or copied"
    assert sum(r.llen(k) for k in keys) == 0


def test_queue_lists_are_the_lists_kombu_polls(redis_server_url: str, queue: str, r: redis.Redis) -> None:
    """Published by kombu, promoted, then taken by kombu: with the router's priority steps
    and a global key prefix."""
    options = {"priority_steps": STEPS, "queue_order_strategy": "priority", "global_keyprefix": "gp:"}
    with Connection(broker_db_url(redis_server_url), transport_options=options) as conn:
        channel = conn.default_channel
        keys = queue_lists(channel, queue)
        assert keys == ["gp:" + k for k in keys_of(queue)]
        q = Queue(queue, Exchange(queue), routing_key=queue)
        producer = Producer(channel, exchange=q.exchange, routing_key=queue)
        now = redis_now(r)
        for doc, priority, age in [("fresh", 1, 0), ("stale", 9, 60), ("staler", 5, 90)]:
            producer.publish(
                {"doc": doc}, priority=priority, headers={H.PUBLISHED_AT: now - age}, declare=[q]
            )
        assert Promoter(r, max_wait=10).promote(keys) == 2
        bound = q(channel)
        taken = []
        while (m := bound.get(no_ack=True)) is not None:
            taken.append(m.payload["doc"])
        assert taken == ["staler", "stale", "fresh"]
        bound.delete()
    for key in r.keys(f"*{queue}*"):
        r.delete(key)
