"""One document ahead for a prefork worker on RabbitMQ while its documents are short
(integration/window.py): the window of a real kombu QoS widens by one on short documents,
narrows on long ones, and every other worker's is left alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from celery import Celery
from celery.worker.consumer.tasks import Tasks
from fakeredis import FakeRedis
from kombu.common import QoS

from priority_router import PriorityRouter
from priority_router.integration import window
from priority_router.integration.brokers import Transport
from priority_router.integration.installation import installation_of
from priority_router.integration.pools import pool_named

PREFORK, THREADS, SOLO = pool_named("prefork", 4), pool_named("threads", 4), pool_named("solo", 1)


class _Consumer(SimpleNamespace):
    __hash__ = object.__hash__  # signals look senders up in a dict, as Celery's consumer


def _consumer(app: Celery, multiplier: int = 1, concurrency: int = 4) -> SimpleNamespace:
    sent: list[int] = []
    qos = QoS(lambda prefetch_count: sent.append(prefetch_count), multiplier * concurrency)
    qos.update()
    return _Consumer(
        app=app, qos=qos, sent=sent, prefetch_multiplier=multiplier, initial_prefetch_count=qos.value
    )


def _installed(transport: Transport, pool: object, dry_run: bool = False) -> Celery:
    app = Celery("window", broker="memory://", set_as_current=False)
    PriorityRouter(redis_client=FakeRedis(), dry_run=dry_run).install(app)
    installation = installation_of(app)
    assert installation is not None
    installation.receiver.transport = transport
    installation.pool = pool  # type: ignore[assignment]
    return app


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _receive(window_: window.ShortDocuments, clock: Clock, n: int, every: float) -> None:
    for _ in range(n):
        window_.received()
        clock.now += every


def test_a_prefork_worker_on_rabbitmq_takes_one_document_ahead_while_its_documents_are_short() -> None:
    consumer = _consumer(_installed(Transport.AMQP, PREFORK))
    clock = Clock()
    short = window.ShortDocuments(consumer, 4, clock)
    _receive(short, clock, 4, 0.0)  # a start fills the window at once
    _receive(short, clock, 4, 0.005)
    assert consumer.qos.value == 4, "nothing is decided before 2 x slots + 1 receipts"
    _receive(short, clock, 1, 0.005)  # 4 slots, 20 ms documents: a receipt every 5 ms
    assert short.wide and consumer.qos.value == 5 and consumer.sent == [4, 5], "the broker is told at once"
    _receive(short, clock, 20, 0.005)
    assert consumer.sent == [4, 5], "widened once"
    _receive(short, clock, 4, 0.04)  # 160 ms documents: between the two bounds, kept
    assert short.wide
    _receive(short, clock, 5, 0.25)  # 1 s documents
    assert not short.wide and consumer.qos.value == 4 and consumer.sent == [4, 5, 4]


def test_receipts_that_arrive_while_the_broker_is_told_widen_nothing_more() -> None:
    consumer = _consumer(_installed(Transport.AMQP, PREFORK))
    clock = Clock()
    short = window.ShortDocuments(consumer, 4, clock)
    told = consumer.qos.callback

    def telling(prefetch_count: int) -> None:
        told(prefetch_count)
        short.received()  # delivered while the worker waits for basic.qos-ok

    consumer.qos.callback = telling
    _receive(short, clock, 12, 0.005)
    assert short.wide and consumer.qos.value == 5 and consumer.sent == [4, 5]


def test_long_documents_never_widen_the_window_even_after_a_start_fills_it() -> None:
    consumer = _consumer(_installed(Transport.AMQP, PREFORK))
    clock = Clock()
    long = window.ShortDocuments(consumer, 4, clock)
    _receive(long, clock, 5, 0.0)  # the start's burst, and one more at once
    _receive(long, clock, 40, 0.25)
    assert not long.wide and consumer.sent == [4]


def test_a_started_step_follows_the_workers_receipts() -> None:
    from celery.signals import task_received

    consumer = _consumer(_installed(Transport.AMQP, PREFORK))
    step = window.WindowStep(consumer)
    step.start(consumer)
    try:
        assert step.window is not None
        for _ in range(9):
            task_received.send(sender=consumer, request=None)
        task_received.send(sender=object(), request=None)  # another consumer's: not counted
        assert step.window.wide and consumer.qos.value == 5
    finally:
        step.stop(consumer)
    assert step.window is None


@pytest.mark.parametrize(
    ("transport", "pool", "multiplier", "dry_run"),
    [
        (Transport.REDIS, PREFORK, 1, False),  # measured not to pay there
        (Transport.AMQP, THREADS, 1, False),
        (Transport.AMQP, SOLO, 1, False),
        (Transport.AMQP, PREFORK, 4, False),  # the user's own multiplier is kept as it is
        (Transport.AMQP, PREFORK, 1, True),  # a dry run changes nothing
    ],
)
def test_every_other_worker_keeps_its_window(
    transport: Transport, pool: object, multiplier: int, dry_run: bool
) -> None:
    consumer = _consumer(_installed(transport, pool, dry_run), multiplier)
    step = window.WindowStep(consumer)
    step.start(consumer)
    assert step.window is None and consumer.qos.value == 4 * multiplier


def test_a_consumer_without_prefetch_is_left_without() -> None:
    consumer = _consumer(_installed(Transport.AMQP, PREFORK))
    consumer.initial_prefetch_count = 0
    step = window.WindowStep(consumer)
    step.start(consumer)
    assert step.window is None and consumer.qos.value == 4


def test_the_step_runs_after_the_task_consumer_builds_its_qos() -> None:
    # Celery's Tasks step rebuilds the QoS from the multiplier at each (re)start.
    assert window.WindowStep.requires == ("celery.worker.consumer.tasks:Tasks",)
    assert f"{Tasks.__module__}:{Tasks.__name__}" == window.WindowStep.requires[0]
    app = _installed(Transport.AMQP, PREFORK)
    window.watch_window(app)
    window.watch_window(app)
    assert list(app.steps["consumer"]).count(window.WindowStep) == 1
