"""Celery 5.6's ``worker_disable_prefetch`` beside the router's prefetch settings, and how
the router knows a ``celery worker`` command is starting (its log not yet set up)."""

from __future__ import annotations

import logging

import click
import fakeredis
import pytest
from celery import Celery
from celery.app.defaults import DEFAULTS
from celery.bin.celery import celery as celery_group
from celery.bin.worker import worker as worker_command

from priority_router import PriorityRouter, Transport
from priority_router.integration import celery_internals
from priority_router.integration.celery_settings import wanted_changes
from priority_router.integration.consumers import Consumer, taking_ahead
from priority_router.integration.pools import pool_named

HAS_DISABLE_PREFETCH = "worker_disable_prefetch" in DEFAULTS
needs_disable_prefetch = pytest.mark.skipif(
    not HAS_DISABLE_PREFETCH, reason="Celery before 5.6 has no worker_disable_prefetch"
)


def _app(broker: str, **settings: object) -> Celery:
    app = Celery("a", broker=broker, set_as_current=False)
    app.conf.update(worker_prefetch_multiplier=4, worker_disable_prefetch=True, **settings)
    return app


def _multiplier_kept(app: Celery, transport: Transport, pool: str = "prefork") -> bool:
    changes = wanted_changes(app, transport, pool_named(pool, 4))
    return any(c.key == "worker_prefetch_multiplier" and c.kept for c in changes)


@needs_disable_prefetch
def test_disable_prefetch_neutralises_the_users_multiplier_on_redis(caplog: pytest.LogCaptureFixture) -> None:
    """A worker with it takes a message only while it holds fewer than its pool runs: the
    multiplier reserves nothing ahead, so keeping it costs nothing and is not warned."""
    app = _app("redis://127.0.0.1:1/0")
    assert not _multiplier_kept(app, Transport.REDIS)
    with caplog.at_level(logging.WARNING, "priority_router"):
        PriorityRouter(redis_client=fakeredis.FakeRedis()).install(app)
    assert app.conf.worker_prefetch_multiplier == 4
    assert "worker_prefetch_multiplier" not in caplog.text


@needs_disable_prefetch
def test_disable_prefetch_does_not_excuse_the_multiplier_where_celery_ignores_it() -> None:
    """Celery ignores it on RabbitMQ; a green pool on Redis still wants the router's 0."""
    assert _multiplier_kept(_app("amqp://guest:guest@127.0.0.1:1//"), Transport.AMQP)
    assert _multiplier_kept(_app("redis://127.0.0.1:1/0"), Transport.REDIS, pool="gevent")


@pytest.mark.skipif(HAS_DISABLE_PREFETCH, reason="Celery 5.6 and later have worker_disable_prefetch")
def test_disable_prefetch_does_nothing_before_celery_5_6() -> None:
    assert _multiplier_kept(_app("redis://127.0.0.1:1/0"), Transport.REDIS)


def test_a_worker_with_disable_prefetch_on_redis_takes_nothing_ahead() -> None:
    """doctor's workers line, from the live workers' own settings."""
    conf = {"worker_prefetch_multiplier": 4, "task_acks_late": True, "worker_disable_prefetch": True}
    found = [Consumer("w@h", "documents", {}, conf)]
    assert taking_ahead(found, Transport.REDIS) == ([] if HAS_DISABLE_PREFETCH else taking_ahead(found))
    assert "worker_prefetch_multiplier=4" in taking_ahead(found, Transport.AMQP)[0]


def test_the_worker_command_is_told_by_celerys_own_commands() -> None:
    """While the ``celery`` group loads the app for ``worker`` (``invoked_subcommand``) and
    while ``worker`` reads its options, whose defaults read the app's configuration."""
    assert not celery_internals.in_worker_command()
    with click.Context(celery_group, info_name="celery") as root:
        assert not celery_internals.in_worker_command()
        root.invoked_subcommand = "worker"
        assert celery_internals.in_worker_command()
        with click.Context(worker_command, info_name="worker", parent=root):
            assert celery_internals.in_worker_command()
    with click.Context(celery_group, info_name="celery") as root:
        root.invoked_subcommand = "beat"
        assert not celery_internals.in_worker_command()
    assert not celery_internals.in_worker_command()


@needs_disable_prefetch
def test_disable_prefetch_on_a_green_pool_with_redis_is_warned() -> None:
    """There it stalls the worker each time its pool fills, as a multiplier of 1 does: the
    router's 0 cannot help, since Celery's own check stops the worker taking messages."""
    app = Celery("a", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.worker_disable_prefetch = True
    changes = {c.key: c for c in wanted_changes(app, Transport.REDIS, pool_named("gevent", 20))}
    kept = changes["worker_disable_prefetch"]
    assert kept.kept and kept.current is True and kept.wanted is False
    assert "stalls for up to 2 s each time its pool fills" in kept.cost
    assert "worker_prefetch_multiplier" in changes and not changes["worker_prefetch_multiplier"].kept
    for transport, pool in ((Transport.REDIS, "threads"), (Transport.AMQP, "gevent")):
        assert "worker_disable_prefetch" not in {
            c.key for c in wanted_changes(app, transport, pool_named(pool, 20))
        }
