"""A kombu before 5.7 (Celery 5.5's): what the router says it lacks, and the wake-up timer
it gives a threads worker's event loop on a real kombu hub."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kombu.asynchronous import Hub

from priority_router import PriorityRouter
from priority_router.integration import old_kombu
from priority_router.integration.brokers import Transport
from priority_router.integration.installation import installation_of
from priority_router.integration.pools import pool_named

THREADS, PREFORK = pool_named("threads", 4), pool_named("prefork", 4)


def test_kombu_5_7_lacks_nothing() -> None:
    assert old_kombu.shortfalls(Transport.REDIS, THREADS, "5.7.0") == []
    assert not old_kombu.wakes_loop(Transport.REDIS, THREADS, "5.7.0")


def test_kombu_5_5_on_redis_names_each_shortfall_for_the_pool() -> None:
    threads = old_kombu.shortfalls(Transport.REDIS, THREADS, "5.5.4")
    assert len(threads) == 2 and "wakes it every 0.05 s" in threads[0] and "100 s" in threads[1]
    assert old_kombu.wakes_loop(Transport.REDIS, THREADS, "5.5.4")
    prefork = old_kombu.shortfalls(Transport.REDIS, PREFORK, "5.5.4")
    assert len(prefork) == 1 and "unacknowledged" in prefork[0]
    assert not old_kombu.wakes_loop(Transport.REDIS, PREFORK, "5.5.4")


def test_kombu_5_5_on_rabbitmq_wakes_a_threads_worker_and_sweeps_nothing() -> None:
    threads = old_kombu.shortfalls(Transport.AMQP, THREADS, "5.5.4")
    assert len(threads) == 1 and "wakes it every 0.05 s" in threads[0]
    assert old_kombu.shortfalls(Transport.AMQP, PREFORK, "5.5.4") == []


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    from celery import Celery
    from fakeredis import FakeRedis

    app = Celery("wake", broker="redis://localhost:6379/0", set_as_current=False)
    PriorityRouter(redis_client=FakeRedis()).install(app)
    installation = installation_of(app)
    assert installation is not None
    installation.receiver.transport = Transport.REDIS
    return SimpleNamespace(app=app, installation=installation)


def test_the_wake_step_makes_a_threads_worker_hub_poll_every_wake_seconds(
    installed: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(old_kombu, "kombu_version", lambda version=None: (5, 5))
    installed.installation.pool = THREADS
    hub = Hub()
    consumer = SimpleNamespace(app=installed.app, hub=hub)
    assert hub.fire_timers() == 1, "an idle hub polls for a second"
    step = old_kombu.WakeStep(consumer)
    step.start(consumer)
    assert hub.fire_timers() <= old_kombu.WAKE
    timer = step.timer
    step.stop(consumer)
    assert step.timer is None and timer.canceled, "a stopping consumer (a reconnection) cancels it"


@pytest.mark.parametrize(("version", "pool"), [((5, 7), THREADS), ((5, 5), PREFORK)])
def test_the_wake_step_leaves_other_workers_alone(
    installed: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, version: tuple[int, int], pool: object
) -> None:
    monkeypatch.setattr(old_kombu, "kombu_version", lambda version_=None: version)
    installed.installation.pool = pool
    hub = Hub()
    consumer = SimpleNamespace(app=installed.app, hub=hub)
    step = old_kombu.WakeStep(consumer)
    step.start(consumer)
    assert step.timer is None and hub.fire_timers() == 1
