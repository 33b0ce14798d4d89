"""What a field trial found in shapes nobody had named: worker pools, settings sources,
the commands' store, printed fixes, unrouted documents, Flower's task list."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import fakeredis
import pytest
from celery import Celery
from celery.concurrency.thread import TaskPool as ThreadPool

from priority_router import ConfigurationError, PriorityRouter, Transport
from priority_router.integration.app_queues import queue_names, routed_queue_names
from priority_router.integration.celery_settings import wanted_changes
from priority_router.integration.flower import format_task
from priority_router.integration.install import unpriced_effect
from priority_router.integration.pools import (
    KOMBU_MAX_CONNECTIONS,
    pool_named,
    pool_of_options,
    pool_of_worker,
)
from priority_router.integration.rabbitmq import QueueNotPriorityError

REDIS = "redis://127.0.0.1:1/0"


def _app(broker: str = REDIS) -> Celery:
    return Celery("trial", broker=broker, set_as_current=False)


# -- pools ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "name", "green"),
    [
        ("gevent", "gevent", True),
        ("eventlet", "eventlet", True),
        ("threads", "threads", False),
        ("processes", "prefork", False),
        (None, "prefork", False),
        (ThreadPool, "threads", False),
        ("celery.concurrency.solo:TaskPool", "solo", False),
    ],
)
def test_a_pool_is_known_by_alias_path_or_class(given: object, name: str, green: bool) -> None:
    pool = pool_named(given, 20)
    assert (pool.name, pool.green, pool.concurrency) == (name, green, 20)


def test_the_command_lines_pool_wins_over_the_setting() -> None:
    conf = {"worker_pool": "threads", "worker_concurrency": 3}
    assert pool_of_options({"pool_cls": "gevent", "concurrency": 50}, conf) == pool_named("gevent", 50)
    assert pool_of_options({}, conf) == pool_named("threads", 3)


def test_an_autoscaled_pool_is_named_by_its_range_and_counted_at_its_most() -> None:
    """A Django trial's --autoscale=4,1 worker said 'concurrency 2' (the CPU count)."""
    pool = pool_of_options({"autoscale": "4,1"}, {})
    assert (pool.concurrency, pool.fewest) == (4, 1)
    assert str(pool) == "prefork pool, autoscaled from 1 to 4"
    worker = type("Worker", (), {"pool_cls": "prefork", "concurrency": 2, "options": {"autoscale": "6,3"}})
    assert str(pool_of_worker(worker)) == "prefork pool, autoscaled from 3 to 6"
    assert pool_of_options({"autoscale": [5, 0]}, {}).concurrency == 5  # as Celery parses it


def test_green_pools_on_redis_need_an_unbounded_window_and_a_connection_per_slot() -> None:
    app = _app()
    changes = {c.key: c for c in wanted_changes(app, Transport.REDIS, pool_named("gevent", 20))}
    assert changes["worker_prefetch_multiplier"].wanted == 0
    assert changes["max_connections"].wanted == 20 + KOMBU_MAX_CONNECTIONS
    assert not changes["max_connections"].kept
    assert "MaxConnectionsError" in changes["max_connections"].cost
    assert "2 s" in changes["worker_prefetch_multiplier"].cost


def test_green_pools_on_rabbitmq_keep_the_window_of_one() -> None:
    app = _app("amqp://guest:guest@127.0.0.1:1//")
    changes = {c.key: c for c in wanted_changes(app, Transport.AMQP, pool_named("gevent", 20))}
    assert changes["worker_prefetch_multiplier"].wanted == 1
    assert "max_connections" not in changes


@pytest.mark.parametrize("pool", ["gevent", "eventlet"])
def test_green_pools_on_rabbitmq_turn_amqp_heartbeats_off(pool: str) -> None:
    # With heartbeats, Celery's green loop on py-amqp takes about one message per 0.1 s.
    app = _app("amqp://guest:guest@127.0.0.1:1//")
    changes = {c.key: c for c in wanted_changes(app, Transport.AMQP, pool_named(pool, 20))}
    assert changes["broker_heartbeat"].wanted == 0
    assert not changes["broker_heartbeat"].kept
    assert "10 documents a second" in changes["broker_heartbeat"].cost
    threads = {c.key for c in wanted_changes(app, Transport.AMQP, pool_named("threads", 20))}
    assert "broker_heartbeat" not in threads


def test_a_users_own_heartbeat_is_kept_and_its_cost_named() -> None:
    app = _app("amqp://guest:guest@127.0.0.1:1//")
    app.conf.broker_heartbeat = 120
    (change,) = [
        c
        for c in wanted_changes(app, Transport.AMQP, pool_named("eventlet", 20))
        if c.key == "broker_heartbeat"
    ]
    assert change.kept and change.current == 120


def test_a_users_own_connection_limit_is_kept_and_named_when_too_small() -> None:
    app = _app()
    app.conf.broker_transport_options = {"max_connections": 12}
    change = next(
        c
        for c in wanted_changes(app, Transport.REDIS, pool_named("eventlet", 20))
        if c.key == "max_connections"
    )
    assert change.kept and change.current == 12
    app.conf.broker_transport_options = {"max_connections": 100}
    keys = {c.key for c in wanted_changes(app, Transport.REDIS, pool_named("eventlet", 20))}
    assert "max_connections" not in keys


def test_the_routers_own_value_is_not_taken_for_the_users() -> None:
    app = _app()
    PriorityRouter(redis_client=fakeredis.FakeRedis()).install(app)
    assert app.conf.worker_prefetch_multiplier == 1  # settled before any worker started
    changes = wanted_changes(
        app, Transport.REDIS, pool_named("gevent", 20), {"worker_prefetch_multiplier": 1}
    )
    prefetch = next(c for c in changes if c.key == "worker_prefetch_multiplier")
    assert prefetch.wanted == 0 and not prefetch.kept


# -- settings sources -------------------------------------------------------------------


def test_the_constructor_reads_the_environment() -> None:
    environ = {"PRIORITY_ROUTER_MODE": "inflight", "PRIORITY_ROUTER_KEY_PREFIX": "env:"}
    router = PriorityRouter(redis_client=fakeredis.FakeRedis(), environ=environ)
    assert (router.config.mode, router.config.key_prefix) == ("inflight", "env:")
    keyword = PriorityRouter(redis_client=fakeredis.FakeRedis(), environ=environ, mode="seed")
    assert keyword.config.mode == "seed", "a keyword wins over the environment"


def test_os_environ_is_read_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIORITY_ROUTER_MODE", "inflight")
    assert PriorityRouter(redis_client=fakeredis.FakeRedis()).config.mode == "inflight"
    monkeypatch.setenv("PRIORITY_ROUTER_MODE", "sideways")
    with pytest.raises(ConfigurationError, match="sideways"):
        PriorityRouter(redis_client=fakeredis.FakeRedis())


def test_the_environment_wins_over_celery_settings() -> None:
    app = _app()
    app.conf.priority_router_key_prefix = "celery:"
    router = PriorityRouter(
        redis_client=fakeredis.FakeRedis(), environ={"PRIORITY_ROUTER_KEY_PREFIX": "env:"}
    )
    router.install(app)
    assert router.config.key_prefix == "env:"


def test_a_read_in_a_fresh_process_follows_the_apps_lazy_configuration() -> None:
    app = _app()
    router = PriorityRouter(redis_client=fakeredis.FakeRedis(), environ={})
    router.install(app)  # before the configuration is loaded, as Django projects do
    app.config_from_object({"priority_router_key_prefix": "django:", "broker_url": REDIS})
    assert not app.configured
    assert router.peek("acme").client_id == "acme"
    assert router.config.key_prefix == "django:"
    assert router.state("acme").key.startswith("django:")


# -- queues and printed fixes -----------------------------------------------------------


def test_task_routes_queues_are_the_apps_queues() -> None:
    app = _app()
    app.conf.task_routes = {
        "docs.*": {"queue": "documents"},
        "reports.make": "reports",
        "other.task": {"exchange": "x"},
    }
    assert sorted(routed_queue_names(app)) == ["documents", "reports"]
    assert queue_names(app)[0] == "celery" and sorted(queue_names(app)[1:]) == ["documents", "reports"]


def test_the_printed_fix_names_the_vhost_and_checks_the_queue_first() -> None:
    error = QueueNotPriorityError(["documents", "reports"], "PRECONDITION_FAILED", "trial")
    fix = error.fix
    assert "rabbitmqctl delete_queue -p trial documents" in fix
    assert "rabbitmqctl delete_queue -p trial reports" in fix
    assert fix.index("list_queues -p trial") < fix.index("delete_queue")
    assert "'trial'" in str(error) and error.queues == ["documents", "reports"]
    assert "-p / celery" in QueueNotPriorityError("celery", "x").fix


# -- unrouted documents -----------------------------------------------------------------


def test_the_unrouted_warning_tells_what_each_broker_does() -> None:
    assert "before every routed document" in unpriced_effect(Transport.REDIS)
    assert "after every routed document" in unpriced_effect(Transport.AMQP)
    assert "not counted" in unpriced_effect(Transport.REDIS, dry_run=True)


class _Worker:
    """What ``worker_init`` and ``worker_ready`` pass (hashable, as Celery's senders are)."""

    def __init__(self, app: Celery, **attributes: object) -> None:
        self.app = app
        self.__dict__.update(attributes)


def test_worker_start_says_mode_and_store_once(caplog: pytest.LogCaptureFixture) -> None:
    from celery.signals import worker_init, worker_ready

    app = _app()
    app.conf.priority_router_mode = "inflight"
    router = PriorityRouter(redis_url="redis://:secret@127.0.0.1:1/8", environ={})
    router.install(app)
    consumer = _Worker(app)
    with caplog.at_level(logging.INFO, "priority_router"):
        worker_init.send(sender=_Worker(app, pool_cls="gevent", concurrency=20))
        worker_ready.send(sender=consumer)
        worker_ready.send(sender=consumer)
    router.uninstall(app)  # stops the gate's thread the ready worker started
    lines = [r.getMessage() for r in caplog.records if "priority-router on" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "mode=inflight" in lines[0] and "redis://:***@127.0.0.1:1/8" in lines[0]
    assert "gevent pool, concurrency 20" in lines[0] and "worker_prefetch_multiplier=0" in lines[0]
    assert "secret" not in lines[0]


# -- Flower -----------------------------------------------------------------------------


def test_flowers_list_shows_the_decision_first() -> None:
    task = SimpleNamespace(
        kwargs="{'document_id': 'd1', 'priority_router_client': 'acme', "
        "'priority_router_priority': 9, 'priority_router_pending': -23}"
    )
    assert format_task(task).kwargs.startswith("client='acme' priority=9 pending=-23 | {")
    plain = SimpleNamespace(kwargs="{'document_id': 'd1'}")
    assert format_task(plain).kwargs == "{'document_id': 'd1'}"
    assert format_task(SimpleNamespace(kwargs=None)).kwargs is None


def test_the_unpriced_warning_tells_a_fixed_priority_from_none() -> None:
    fixed = unpriced_effect(Transport.REDIS, wire=5)
    assert "fixed priority" in fixed and "priority-5" in fixed and "before every" not in fixed
    assert "priority-5" in unpriced_effect(Transport.AMQP, wire=5)
    assert "priority-2" in unpriced_effect(Transport.AMQP, wire=8)
    assert "before every routed document" in unpriced_effect(Transport.REDIS, wire=0)
