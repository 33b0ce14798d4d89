from __future__ import annotations

import logging

import fakeredis
import pytest
from celery import Celery
from celery.signals import before_task_publish

from priority_router import ConfigurationError, PriorityRouter


def router() -> PriorityRouter:
    return PriorityRouter(redis_client=fakeredis.FakeRedis())


def receivers_of(app: Celery) -> int:
    return sum(1 for key, _ in before_task_publish.receivers if key[0] == f"priority_router:{id(app)}")


def test_install_sets_what_redis_priorities_need() -> None:
    app = Celery("a", broker="redis://127.0.0.1:1/0", set_as_current=False)
    router().install(app)
    options = app.conf.broker_transport_options
    assert options["priority_steps"] == list(range(10))
    assert options["queue_order_strategy"] == "priority"
    assert app.conf.worker_prefetch_multiplier == 1
    assert app.conf.task_acks_late is True


def test_install_keeps_the_users_transport_options() -> None:
    app = Celery("a", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.broker_transport_options = {
        "visibility_timeout": 7200,
        "global_keyprefix": "tenant1:",
        "unacked_restore_interval": 5,
    }
    router().install(app)
    options = app.conf.broker_transport_options
    assert options["visibility_timeout"] == 7200
    assert options["global_keyprefix"] == "tenant1:"
    assert options["unacked_restore_interval"] == 5
    assert options["priority_steps"] == list(range(10))


def test_explicit_conflicting_values_are_kept_and_warned(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("a", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.worker_prefetch_multiplier = 4
    app.conf.task_acks_late = False
    app.conf.broker_transport_options = {"priority_steps": [0, 3, 6, 9]}
    with caplog.at_level(logging.WARNING, "priority_router"):
        router().install(app)
    assert app.conf.worker_prefetch_multiplier == 4
    assert app.conf.task_acks_late is False
    assert app.conf.broker_transport_options["priority_steps"] == [0, 3, 6, 9]
    text = caplog.text
    assert "worker_prefetch_multiplier=4" in text and "task_acks_late=False" in text
    assert "priority_steps" in text and "arrival order" in text


def test_amqp_app_gets_priority_queues() -> None:
    app = Celery("a", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False)
    router().install(app)
    assert app.conf.task_queue_max_priority == 10
    assert "broker_transport_options" not in app.conf.changes or not app.conf.broker_transport_options.get(
        "priority_steps"
    )


def test_install_is_idempotent() -> None:
    app = Celery("a", broker="redis://127.0.0.1:1/0", set_as_current=False)
    r = router()
    first = r.install(app)
    assert r.install(app) is first
    assert receivers_of(app) == 1
    assert f"priority_router:wait:{id(app)}" in prerun_uids()
    r.uninstall(app)
    assert receivers_of(app) == 0
    assert f"priority_router:wait:{id(app)}" not in prerun_uids()


def prerun_uids() -> set[str]:
    from celery.signals import task_prerun

    return {key[0] for key, _ in task_prerun.receivers if isinstance(key[0], str)}


def test_second_router_on_same_app_is_refused() -> None:
    app = Celery("a", broker="redis://127.0.0.1:1/0", set_as_current=False)
    r = router()
    r.install(app)
    with pytest.raises(ConfigurationError, match="already has another PriorityRouter"):
        router().install(app)
    r.uninstall(app)


def test_unsupported_broker_is_refused_at_install() -> None:
    app = Celery("a", broker="filesystem://", set_as_current=False)
    with pytest.raises(ConfigurationError, match="broker_url"):
        router().install(app)


def test_quorum_queue_warns_what_the_user_gets(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("a", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False)
    app.conf.task_default_queue_type = "quorum"
    with caplog.at_level(logging.WARNING, "priority_router"):
        router().install(app)
    assert "quorum queue" in caplog.text and "two priorities" in caplog.text


def test_amqp_queues_declared_by_the_user_keep_their_arguments() -> None:
    from kombu import Queue

    app = Celery("a", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False)
    app.conf.task_queues = [
        Queue("mine", queue_arguments={"x-message-ttl": 60000}),
        Queue("capped", queue_arguments={"x-max-priority": 10, "x-expires": 1000}),
    ]
    router().install(app)
    queues = app.amqp.queues
    assert queues["mine"].queue_arguments == {"x-message-ttl": 60000, "x-max-priority": 10}
    assert queues["capped"].queue_arguments == {"x-max-priority": 10, "x-expires": 1000}
