"""``dry_run=True``: decisions are made, counted and shown, and nothing the broker or the
app sees changes."""

from __future__ import annotations

import copy
import logging
from typing import Any

import fakeredis
import pytest
from celery import Celery
from celery._state import _task_stack
from kombu import Queue
from support.publishing import publishing_as
from test_receiver import _RunningTask, publish

from priority_router import ConfigurationError, PriorityRouter, RouterConfig
from priority_router import headers as H
from priority_router.integration.consumers import ConsumerWatch
from priority_router.integration.rabbitmq import follow_priority_queue
from priority_router.metrics import get_metrics

REDIS_BROKER = "redis://127.0.0.1:1/0"
AMQP_BROKER = "amqp://guest:guest@127.0.0.1:1//"
#: Everything install() would otherwise change on an app.
WATCHED = (
    "worker_prefetch_multiplier",
    "task_acks_late",
    "broker_transport_options",
    "task_queue_max_priority",
)


def dry_router(**settings: Any) -> PriorityRouter:
    return PriorityRouter(redis_client=fakeredis.FakeRedis(), dry_run=True, **settings)


def conf_of(app: Celery) -> dict[str, Any]:
    """The app's settings and queue declarations, as plain data to compare."""
    queues = {name: (q.queue_arguments, q.exchange.name) for name, q in app.amqp.queues.items()}
    return {
        "changes": copy.deepcopy(dict(app.conf.changes)),
        **{key: copy.deepcopy(app.conf.get(key)) for key in WATCHED},
        "queues": queues,
        "max_priority": app.amqp.queues.max_priority,
    }


# -- the setting ------------------------------------------------------------------------


def test_dry_run_is_off_by_default_and_a_keyword() -> None:
    assert RouterConfig().dry_run is False
    assert PriorityRouter(dry_run=True).config.dry_run is True


@pytest.mark.parametrize(("text", "expected"), [("true", True), ("1", True), ("off", False), ("no", False)])
def test_dry_run_from_the_environment(text: str, expected: bool) -> None:
    assert RouterConfig.from_env({"PRIORITY_ROUTER_DRY_RUN": text}).dry_run is expected


def test_a_bad_dry_run_names_the_setting() -> None:
    with pytest.raises(ConfigurationError, match="PRIORITY_ROUTER_DRY_RUN"):
        RouterConfig.from_env({"PRIORITY_ROUTER_DRY_RUN": "maybe"})
    with pytest.raises(ConfigurationError) as info:
        PriorityRouter(dry_run="yes")
    assert info.value.setting == "dry_run"


@pytest.mark.parametrize("value", [True, "true"])
def test_dry_run_from_the_celery_setting(value: object) -> None:
    app = Celery("proj", set_as_current=False)
    router = PriorityRouter(redis_client=fakeredis.FakeRedis())
    router.install(app)
    app.config_from_object({"broker_url": REDIS_BROKER, "priority_router_dry_run": value})
    assert app.conf.broker_url
    assert router.config.dry_run is True
    assert app.conf.worker_prefetch_multiplier == 4, "read before any setting was applied"


# -- install changes no setting, and says what it would --------------------------------


@pytest.mark.parametrize("broker", [REDIS_BROKER, AMQP_BROKER])
def test_install_changes_no_setting(broker: str) -> None:
    plain = Celery("a", broker=broker, set_as_current=False)
    app = Celery("a", broker=broker, set_as_current=False)
    app.conf.task_queues = plain.conf.task_queues = [Queue("docs"), Queue("other")]
    before = conf_of(app)
    dry_router().install(app)
    assert conf_of(app) == before == conf_of(plain)
    # The sender is built: the router settles again.  Celery before 5.7 adds the default
    # queue to app.amqp.queues there itself, so the plain app builds its sender too.
    app.amqp._create_task_sender()
    plain.amqp._create_task_sender()
    assert conf_of(app) == conf_of(plain)


def test_one_warning_per_app_lists_what_it_would_change(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("a", broker=REDIS_BROKER, set_as_current=False)
    app.conf.task_acks_late = False  # the user's own choice: kept, even once switched on
    with caplog.at_level(logging.INFO, "priority_router"):
        dry_router().install(app)
        app.amqp._create_task_sender()
        app.config_from_object({"broker_url": REDIS_BROKER})
        assert app.conf.broker_url  # configuration reloaded: settles once more
    records = [r for r in caplog.records if r.name == "priority_router"]
    assert len(records) == 1, caplog.text
    assert records[0].levelno == logging.WARNING
    text = records[0].getMessage()
    assert text.startswith(f"priority-router dry run on {app!r}: priorities are computed, counted and shown")
    assert "no Celery setting is changed" in text and "dry_run=False" in text
    assert "worker_prefetch_multiplier=1 (now 4)" in text
    steps = "broker_transport_options['priority_steps']=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9] (now [0, 3, 6, 9])"
    assert steps in text
    assert "broker_transport_options['queue_order_strategy']='priority' (now 'round_robin')" in text
    assert "it would keep your task_acks_late=False" in text
    assert "keeps your" not in text, "no kept-setting warning: nothing is applied"


def test_amqp_dry_run_names_the_queues_and_leaves_quorum_queues_unsaid(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Celery("a", broker=AMQP_BROKER, set_as_current=False)
    app.conf.task_queues = [Queue("docs"), Queue("replicated", queue_arguments={"x-queue-type": "quorum"})]
    app.amqp.queues  # noqa: B018 - built before install, as in a worker
    with caplog.at_level(logging.INFO, "priority_router"):
        dry_router().install(app)
    (record,) = [r for r in caplog.records if r.name == "priority_router"]
    text = record.getMessage()
    assert "x-max-priority=10 on queue 'docs' (now none)" in text
    assert "replicated" not in text and "quorum" not in text


def test_switching_on_later_applies_the_settings() -> None:
    app = Celery("a", broker=REDIS_BROKER, set_as_current=False)
    router = dry_router()
    router.install(app)
    router.uninstall(app)
    PriorityRouter(redis_client=fakeredis.FakeRedis()).install(app)
    assert app.conf.worker_prefetch_multiplier == 1 and app.conf.task_acks_late is True
    assert app.conf.broker_transport_options["priority_steps"] == list(range(10))


def test_a_dry_run_sender_follows_a_priority_queue_and_leaves_other_refusals_to_plain_celery() -> None:
    app = Celery("a", broker=AMQP_BROKER, set_as_current=False)
    app.conf.task_queues = [
        Queue("plain"),
        Queue("declared", queue_arguments={"x-max-priority": 10}),
        Queue("replicated", queue_arguments={"x-queue-type": "quorum"}),
    ]
    dry_router().install(app)
    queues = app.amqp.queues
    # Refused because it exists as a priority queue (a router switched on made it one): followed.
    assert follow_priority_queue(app, "plain")
    assert queues["plain"].queue_arguments == {"x-max-priority": 10}
    # Refused because it exists without x-max-priority, or as another type: plain Celery's error.
    assert not follow_priority_queue(app, "declared")
    assert queues["declared"].queue_arguments == {"x-max-priority": 10}
    assert not follow_priority_queue(app, "replicated")
    assert not follow_priority_queue(app, "undeclared")


def test_publishers_do_not_look_for_blind_workers() -> None:
    app = Celery("a", broker=REDIS_BROKER, set_as_current=False)
    receiver = dry_router(consumer_check_interval=1).install(app)
    watch = ConsumerWatch(app, receiver, 1)
    watch.published()
    assert watch._thread is None, "no background check started"
    assert watch.check() == []
    watch.stop()


# -- publishing: decided, counted, shown; the wire priority is Celery's -------------------


@pytest.fixture
def app() -> Celery:
    return Celery("unit", broker=REDIS_BROKER, set_as_current=False)


def test_counted_documents_are_shown_but_keep_celerys_priority(app: Celery) -> None:
    router = dry_router()
    receiver = router.install(app)
    for _ in range(3):
        publish(receiver, app, headers={"client_id": "acme"})
    headers, properties = publish(receiver, app, headers={"client_id": "acme"})
    assert "priority" not in properties
    assert headers[H.PRIORITY] == 2 and headers[H.PENDING] == -3 and headers[H.REASON] == "counted"
    assert headers[H.DRY_RUN] is True and isinstance(headers[H.PUBLISHED_AT], float)
    assert router.peek("acme").pending == -3, "dry run counts like the real thing"


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"kwargs": {"client_id": None}}, "no-client"),
        ({"task": "maintenance.vacuum", "headers": {"client_id": "acme"}}, "not-counted"),
        ({"headers": {"client_id": "acme"}, "priority": 7}, "explicit"),
        ({"priority": 0}, "explicit"),
    ],
)
def test_every_reason_leaves_the_priority_property_alone(
    app: Celery, kwargs: dict[str, Any], reason: str
) -> None:
    receiver = dry_router(tasks=["docs.*"]).install(app)
    headers, properties = publish(receiver, app, **kwargs)
    assert properties.get("priority") == kwargs.get("priority")
    assert headers[H.REASON] == reason and headers[H.DRY_RUN] is True


def test_the_apps_default_priority_stays_as_celery_set_it(app: Celery) -> None:
    app.conf.task_default_priority = 3
    receiver = dry_router().install(app)
    for _ in range(24):
        headers, properties = publish(receiver, app, headers={"client_id": "heavy"}, priority=3)
    assert properties["priority"] == 3 and headers[H.PRIORITY] == 9, "would have been 9"
    _, properties = publish(receiver, app, task="elsewhere.registered")
    assert "priority" not in properties


def test_inherited_decisions_leave_the_priority_property_alone(app: Celery) -> None:
    router = dry_router()
    receiver = router.install(app)
    parent = _RunningTask(client_id="acme", priority_router_priority=7, priority_router_pending=-13)
    _task_stack.push(parent)
    try:
        child, child_props = publish(receiver, app, headers={"parent_id": "p"})
    finally:
        _task_stack.pop()
    retry, retry_props = publish(receiver, app, headers={**child, "retries": 1})
    assert "priority" not in child_props and "priority" not in retry_props
    assert child[H.REASON] == retry[H.REASON] == "inherited" and retry[H.PRIORITY] == 7
    assert router.peek("acme").pending == 0


def test_expires_stays_a_rabbitmq_ttl() -> None:
    amqp_app = Celery("unit", broker=AMQP_BROKER, set_as_current=False)
    receiver = dry_router().install(amqp_app)
    message_headers = {"task": "t", "id": "x", "expires": "2030-01-01T00:00:00+00:00"}
    properties: dict[str, Any] = {"expiration": 5.0}
    with publishing_as(amqp_app):
        receiver(sender="t", body=((), {}, {}), headers=message_headers, properties=properties)
    assert properties == {"expiration": 5.0}
    assert message_headers[H.REASON] == "no-client" and message_headers[H.DRY_RUN] is True


def test_flower_sees_a_would_be_decision(app: Celery) -> None:
    receiver = dry_router().install(app)
    headers, _ = publish(receiver, app, headers={"client_id": "acme", "kwargsrepr": "{'doc': 'd1'}"})
    assert headers["kwargsrepr"] == (
        "{'doc': 'd1', 'priority_router_client': 'acme', 'priority_router_priority': 1, "
        "'priority_router_pending': 0, 'priority_router_dry_run': True}"
    )


def test_metrics_record_would_be_decisions(app: Celery) -> None:
    metrics = get_metrics()
    assert metrics is not None
    counted = metrics.assignments.labels("1", "counted")
    before = counted._value.get()
    receiver = dry_router(metrics=True).install(app)
    publish(receiver, app, headers={"client_id": "acme"})
    assert counted._value.get() == before + 1


class _Received:
    """What Celery's ``task_received`` signal passes as ``request``."""

    def __init__(self, app: Celery, headers: dict[str, Any]) -> None:
        self.app = app
        self.name, self.id = "docs.process", "t-1"
        self.request_dict = headers
        self.delivery_info = {"routing_key": "docs"}


def test_workers_say_once_what_a_mixed_dry_run_costs(caplog: pytest.LogCaptureFixture) -> None:
    from priority_router.integration.install import _on_task_received

    live = Celery("live", broker=REDIS_BROKER, set_as_current=False)
    dry = Celery("dry", broker=REDIS_BROKER, set_as_current=False)
    PriorityRouter(redis_client=fakeredis.FakeRedis()).install(live)
    dry_router().install(dry)
    from_dry_run = {H.REASON: "counted", H.DRY_RUN: True}
    with caplog.at_level(logging.WARNING, "priority_router"):
        for _ in range(3):
            _on_task_received(request=_Received(live, from_dry_run))
            _on_task_received(request=_Received(dry, from_dry_run))
            _on_task_received(request=_Received(dry, {}))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "from a publisher whose router is in dry run" in messages[0] and "dry_run=False" in messages[0]
    assert "this dry run does not show them" in messages[1]
