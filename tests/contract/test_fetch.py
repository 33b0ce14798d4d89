"""A worker's reliable fetch (``integration/reliable_fetch.py``, ``lua/fetch.lua``) on a real
Redis, with kombu's own channel, lists and unacked hash."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from queue import Empty
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue
from support.services import broker_db_url

from priority_router.integration import reliable_fetch
from priority_router.integration.reliable_fetch import ReliableFetch

pytestmark = pytest.mark.integration


@pytest.fixture
def queue() -> str:
    return f"fetch-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def url(redis_server_url: str, queue: str) -> Iterator[str]:
    url = broker_db_url(redis_server_url)
    yield url
    client = redis.Redis.from_url(url)
    keys = client.keys(f"*{queue}*")
    if keys:
        client.delete(*keys)
    client.close()


def options(queue: str, **extra: Any) -> dict[str, Any]:
    return {
        "priority_steps": list(range(10)),
        "queue_order_strategy": "priority",
        "unacked_key": f"{queue}.unacked",
        "unacked_index_key": f"{queue}.unacked_index",
        **extra,
    }


def publish(conn: Connection, queue: Queue, *priorities: int) -> None:
    producer = Producer(conn.channel())
    for n, priority in enumerate(priorities):
        producer.publish(
            {"n": n}, exchange=queue.exchange, routing_key=queue.name, declare=[queue], priority=priority
        )


def kombu_queue(name: str) -> Queue:
    return Queue(name, Exchange(name), routing_key=name)


def consume(conn: Connection, queue: Queue, n: int, seen: Any = None) -> list[int]:
    """The first ``n`` messages the channel takes, through the reliable fetch, acked."""
    got: list[int] = []

    def on_message(body: dict[str, int], message: Any) -> None:
        got.append(body["n"])
        if seen is not None:
            seen(message)
        message.ack()

    channel = conn.default_channel
    with Consumer(channel, [queue], callbacks=[on_message]):
        ReliableFetch(channel).install()
        deadline = time.monotonic() + 10
        while len(got) < n and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=1)
    return got


def nothing() -> None:
    raise Empty()


def test_documents_are_taken_most_urgent_first_in_publish_order(url: str, queue: str) -> None:
    q = kombu_queue(queue)
    with Connection(url, transport_options=options(queue)) as conn:
        publish(conn, q, 5, 0, 9, 0, 5)
        assert consume(conn, q, 5) == [1, 3, 0, 4, 2]


def test_a_taken_document_is_unacked_before_the_worker_sees_it_and_kombu_puts_it_back(
    url: str, queue: str
) -> None:
    """The script's record is kombu's: its sweep puts the document back in its list, with its
    priority, as it does one kombu recorded."""
    q = kombu_queue(queue)
    broker = redis.Redis.from_url(url)
    with Connection(url, transport_options=options(queue)) as conn:
        publish(conn, q, 7)
        channel = conn.default_channel
        with Consumer(channel, [q]):
            fetch = ReliableFetch(channel)
            command = fetch.command()
            assert command is not None and command[0] == "EVAL"
            key, raw = broker.execute_command(*command)  # what the worker's socket would carry
        assert key.decode() == f"{queue}\x06\x167"
        tag = json.loads(raw)["properties"]["delivery_tag"]
        assert broker.llen(key) == 0
        assert broker.zscore(f"{queue}.unacked_index", tag) == pytest.approx(time.time(), abs=5)
        message, exchange, routing_key = json.loads(broker.hget(f"{queue}.unacked", tag))
        assert (message, exchange, routing_key) == (json.loads(raw), queue, queue)
        channel.qos.restore_by_tag(tag)  # kombu's sweep, for a tag past visibility_timeout
        assert broker.hlen(f"{queue}.unacked") == 0
        back = json.loads(broker.rpop(key))
        assert back["properties"]["delivery_tag"] == tag and back["headers"]["redelivered"] is True


def test_an_idle_worker_waits_on_a_list_without_moving_it(url: str, queue: str) -> None:
    """It waits on the list of a client with nothing pending, and the wait moves nothing."""
    q = kombu_queue(queue)
    broker = redis.Redis.from_url(url)
    idle = f"{queue}\x06\x161"
    with Connection(url, transport_options=options(queue)) as conn:
        channel = conn.default_channel
        with Consumer(channel, [q]):
            fetch = ReliableFetch(channel, idle_step=1)
            first = fetch.command()
            assert first is not None
            assert broker.execute_command(*first) is None
            with pytest.raises(Empty):
                fetch.read(nothing)  # kombu's read of the script's nil
            wait = fetch.command()
            assert wait == ["BLMOVE", idle, idle, "RIGHT", "RIGHT", reliable_fetch.WAIT]
        publish(conn, q, 1, 1, 1)
        before = broker.lrange(idle, 0, -1)
        assert broker.execute_command(*wait) == before[-1]  # returns at once, with the oldest
        assert broker.lrange(idle, 0, -1) == before  # nothing moved: the order is kept


def test_a_global_key_prefix_names_every_key(url: str, queue: str) -> None:
    q = kombu_queue(queue)
    broker = redis.Redis.from_url(url)
    with Connection(url, transport_options=options(queue, global_keyprefix="pfx:")) as conn:
        publish(conn, q, 0, 3)
        seen: list[bool] = []
        got = consume(
            conn, q, 2, lambda m: seen.append(broker.hexists(f"pfx:{queue}.unacked", m.delivery_tag))
        )
        assert got == [0, 1] and seen == [True, True]
        assert broker.keys(f"{queue}*") == []


@pytest.mark.parametrize(("command", "named"), [("eval", "fetch script"), ("blmove", "wait (BLMOVE)")])
def test_a_broker_that_refuses_a_command_is_served_by_brpop_and_said_so_once(
    url: str, queue: str, command: str, named: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A least-privilege broker user without EVAL or BLMOVE: the worker still takes every
    document, published while it waits."""
    admin = redis.Redis.from_url(url)
    user, password = f"u-{queue}", "pw"
    admin.acl_setuser(
        user,
        enabled=True,
        passwords=[f"+{password}"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", f"-{command}"],
    )
    try:
        limited = url.replace("redis://", f"redis://{user}:{password}@")
        q = kombu_queue(queue)
        with (
            caplog.at_level(logging.WARNING, "priority_router"),
            Connection(limited, transport_options=options(queue)) as conn,
            Connection(url, transport_options=options(queue)) as publisher,
        ):
            publish(publisher, q, 0)
            later = threading.Timer(0.5, publish, (publisher, q, 0, 5, 9))
            later.start()
            try:
                assert sorted(consume(conn, q, 4)) == [0, 0, 1, 2]
            finally:
                later.join()
        warnings = [r.getMessage() for r in caplog.records if "refused the worker's" in r.getMessage()]
        assert len(warnings) == 1 and named in warnings[0], warnings
    finally:
        admin.acl_deluser(user)
