"""Publishers hold publishes to a RabbitMQ queue while ``priority-router migrate`` swaps it,
and cost nothing more when no migration runs."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import fakeredis
import pytest
from celery import Celery
from kombu import Queue
from support.publishing import publishing_as

from priority_router import PriorityRouter
from priority_router.integration import publisher_pause
from priority_router.integration.publisher_pause import Mark, MigrationMark, PublishPause, alive_key

PREFIX = "pause-test:"


class CountingRedis(fakeredis.FakeRedis):
    """A fake Redis that counts the commands sent to it."""

    sent: list[str]

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.__dict__.setdefault("sent", []).append(str(args[0]))
        return super().execute_command(*args, **options)


@pytest.fixture
def client() -> CountingRedis:
    return CountingRedis()


@pytest.fixture
def app() -> Celery:
    # memory://: a release declares the queue in memory, nothing connects.
    return Celery("unit", broker="memory://", set_as_current=False)


def pause_of(app: Celery, client: fakeredis.FakeRedis) -> PublishPause:
    return PublishPause(app, lambda: (client, PREFIX))


def marking(
    client: fakeredis.FakeRedis, queue: str = "documents", vhost: str = "/", **kw: Any
) -> MigrationMark:
    return MigrationMark(
        client, PREFIX, Mark(vhost, queue, "router", frozenset(kw.get("routes", ())), time.time())
    )


def held_for(pause: PublishPause, *args: Any) -> float:
    started = time.monotonic()
    pause.hold(*args)
    return time.monotonic() - started


def test_no_migration_costs_one_read_per_refresh_not_per_publish(app: Celery, client: CountingRedis) -> None:
    pause = pause_of(app, client)
    for _ in range(1000):
        pause.hold("", "documents", [])
    assert client.__dict__.get("sent", []) == ["HGETALL"]


def test_a_marked_queue_holds_its_publishes_until_the_mark_goes(
    app: Celery, client: CountingRedis, caplog: pytest.LogCaptureFixture
) -> None:
    mark = marking(client)
    mark.set()
    pause = pause_of(app, client)
    threading.Timer(0.4, mark.remove).start()
    with caplog.at_level(logging.INFO, "priority_router"):
        waited = held_for(pause, "", "documents", [])
    assert 0.35 < waited < 2
    said = [r.getMessage() for r in caplog.records]
    assert any("wait while `priority-router migrate documents --to router" in m for m in said)
    assert any("resumed" in m for m in said)
    assert held_for(pause, "", "documents", []) < 0.05


def test_only_the_marked_queue_of_the_same_vhost_waits(app: Celery, client: CountingRedis) -> None:
    marking(client, "documents", vhost="other").set()
    marking(client, "reports").set()
    pause = pause_of(app, client)
    assert held_for(pause, "", "documents", []) < 0.05
    assert held_for(pause, "docs-exchange", "documents", []) < 0.05


def test_the_queue_is_found_by_its_declaration_or_by_a_route(app: Celery, client: CountingRedis) -> None:
    mark = marking(client, routes=[("feeds", "feeds.new")])
    mark.set()
    threading.Timer(0.3, mark.remove).start()
    assert held_for(pause_of(app, client), "feeds", "feeds.new", []) > 0.25
    mark.set()
    threading.Timer(0.3, mark.remove).start()
    assert held_for(pause_of(app, client), "docs", "docs.key", [Queue("documents")]) > 0.25


def test_a_killed_migrations_mark_releases_publishes_with_one_error(
    app: Celery, client: CountingRedis, caplog: pytest.LogCaptureFixture
) -> None:
    mark = marking(client)
    mark.set()
    mark._stop.set()  # the migrator dies: nothing renews the mark
    client.delete(alive_key(PREFIX, mark.mark.field))
    pause = pause_of(app, client)
    with caplog.at_level(logging.INFO, "priority_router"):
        assert held_for(pause, "", "documents", []) < 0.05
        assert held_for(pause, "", "documents", []) < 0.05
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "stopped before it finished" in errors[0] and "priority-router migrate documents" in errors[0]


def test_a_publish_waits_at_most_the_hold_limit(
    app: Celery, client: CountingRedis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(publisher_pause, "HOLD_LIMIT", 0.3)
    mark = marking(client)
    mark.set()
    try:
        with caplog.at_level(logging.ERROR, "priority_router"):
            assert 0.25 < held_for(pause_of(app, client), "", "documents", []) < 2
    finally:
        mark.remove()
    assert any("waited the longest allowed" in r.getMessage() for r in caplog.records)


def test_a_store_that_fails_never_holds_a_publish(app: Celery) -> None:
    def broken() -> Any:
        raise ConnectionError("down")

    pause = PublishPause(app, broken)
    assert held_for(pause, "", "documents", []) < 0.05


def test_the_migrators_mark_stays_alive_while_it_runs_and_goes_with_it(client: CountingRedis) -> None:
    mark = marking(client)
    mark.set()
    assert mark.is_set() and 0 < client.pttl(alive_key(PREFIX, mark.mark.field)) <= publisher_pause.ALIVE_MS
    assert client.pttl(publisher_pause.migrations_key(PREFIX)) > 0
    assert mark.remove() and not mark.is_set()
    assert not client.exists(alive_key(PREFIX, mark.mark.field))
    assert not mark.remove()


def test_the_installed_receiver_holds_a_rabbitmq_publish(client: CountingRedis) -> None:
    app = Celery("unit", broker="amqp://guest@127.0.0.1:1//", set_as_current=False)
    receiver = PriorityRouter(redis_client=client, key_prefix=PREFIX).install(app)
    mark = marking(client)
    mark.set()
    threading.Timer(0.3, mark.remove).start()
    started = time.monotonic()
    with publishing_as(app):
        receiver(
            sender="docs.process",
            body=([], {}, {}),
            exchange="",
            routing_key="documents",
            declare=[],
            headers={"lang": "py", "task": "docs.process", "id": "t-1", "retries": 0},
            properties={"correlation_id": "t-1"},
        )
    assert time.monotonic() - started > 0.25
