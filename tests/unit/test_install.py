from __future__ import annotations

import gc
import logging
import subprocess
import sys
import weakref

import fakeredis
import pytest
from celery import Celery
from support.celery_versions import needs_queue_type_setting

from priority_router import ConfigurationError, PriorityRouter, Transport
from priority_router.integration import rabbitmq
from priority_router.integration.brokers import AMQP_MAX_PRIORITY
from priority_router.router import engine_of, installed_router


def router() -> PriorityRouter:
    return PriorityRouter(redis_client=fakeredis.FakeRedis())


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


def test_kept_values_are_named_as_a_namespaced_app_writes_them(caplog: pytest.LogCaptureFixture) -> None:
    """Django's settings.py says CELERY_TASK_ACKS_LATE, not task_acks_late."""
    app = Celery("a", set_as_current=False)
    settings = type(
        "Settings",
        (),
        {
            "CELERY_BROKER_URL": "redis://127.0.0.1:1/0",
            "CELERY_TASK_ACKS_LATE": False,
            "CELERY_BROKER_TRANSPORT_OPTIONS": {"priority_steps": [0, 3, 6, 9]},
        },
    )
    app.config_from_object(settings, namespace="CELERY")
    with caplog.at_level(logging.WARNING, "priority_router"):
        router().install(app)
    assert app.conf.task_acks_late is False
    assert "keeps your CELERY_TASK_ACKS_LATE=False" in caplog.text
    assert "keeps your CELERY_BROKER_TRANSPORT_OPTIONS['priority_steps']=[0, 3, 6, 9]" in caplog.text


def test_amqp_app_gets_priority_queues() -> None:
    app = Celery("a", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False)
    router().install(app)
    assert app.conf.task_queue_max_priority == 10
    assert "broker_transport_options" not in app.conf.changes or not app.conf.broker_transport_options.get(
        "priority_steps"
    )


def test_install_is_idempotent_and_uninstall_restores_plain_celery() -> None:
    app = Celery("a", broker="redis://127.0.0.1:1/0", set_as_current=False)
    plain_builder = app.amqp._create_task_sender
    r = PriorityRouter(redis_client=fakeredis.FakeRedis(), metrics=True)
    first = r.install(app)
    assert r.install(app) is first
    assert installed_router(app) is r
    assert f"priority_router:wait:{id(app)}" in prerun_uids()
    sender = app.amqp.send_task_message
    assert sender.__wrapped__ is not None
    r.uninstall(app)
    assert installed_router(app) is None
    assert f"priority_router:wait:{id(app)}" not in prerun_uids()
    assert not hasattr(app.amqp.send_task_message, "__wrapped__")
    assert app.amqp._create_task_sender == plain_builder
    assert app.on_after_configure.receivers == []


@pytest.mark.parametrize("uninstall", [True, False])
def test_a_dropped_app_can_be_garbage_collected(uninstall: bool) -> None:
    app = Celery("a", broker="redis://127.0.0.1:1/0", set_as_current=False)
    r = PriorityRouter(redis_client=fakeredis.FakeRedis(), metrics=True)
    r.install(app)
    assert app.amqp.send_task_message.__wrapped__ is not None  # the sender is built and wrapped
    if uninstall:
        r.uninstall(app)
    ref = weakref.ref(app)
    del app
    gc.collect()
    assert ref() is None


def test_metrics_are_opt_in() -> None:
    code = (
        "import fakeredis, prometheus_client\n"
        "from celery import Celery\n"
        "from priority_router import PriorityRouter\n"
        "from priority_router.router import engine_of\n"
        "app = Celery('a', broker='redis://127.0.0.1:1/0')\n"
        "router = PriorityRouter(redis_client=fakeredis.FakeRedis())\n"
        "router.install(app)\n"
        "assert engine_of(router).metrics is None\n"
        "names = [n for n in prometheus_client.REGISTRY._names_to_collectors if 'priority_router' in n]\n"
        "assert not names, names\n"
        "from celery.signals import task_prerun, worker_ready\n"
        "assert not task_prerun.receivers and not worker_ready.receivers\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=60)


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


def test_unsupported_broker_is_refused_at_install_when_known() -> None:
    app = Celery("a", broker="filesystem://", set_as_current=False)
    assert app.conf.broker_url  # configured before install
    with pytest.raises(ConfigurationError, match="broker_url"):
        router().install(app)
    assert installed_router(app) is None


def test_unsupported_broker_configured_after_install_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("a", set_as_current=False)
    router().install(app)
    with caplog.at_level(logging.ERROR, "priority_router"):
        app.config_from_object({"broker_url": "filesystem://"})
        assert app.conf.broker_url == "filesystem://"
        app.amqp._create_task_sender()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    message = errors[0].getMessage()
    assert "cannot route" in message and "Fix:" in message
    assert "refuses to start" in message, "a worker loading the same app is refused: said, not hidden"


def test_install_before_configuration_follows_the_final_configuration() -> None:
    app = Celery("proj", set_as_current=False)
    router().install(app)
    app.config_from_object(
        {"broker_url": "redis://127.0.0.1:1/0", "task_default_queue": "proj-b"}, namespace=None
    )
    assert app.amqp.default_queue.name == "proj-b"
    assert app.conf.broker_transport_options["priority_steps"] == list(range(10))
    assert app.conf.worker_prefetch_multiplier == 1 and app.conf.task_acks_late is True
    assert app.conf.task_queue_max_priority is None, "not RabbitMQ"


def test_django_style_namespace_configuration_after_install() -> None:
    class Settings:
        CELERY_BROKER_URL = "amqp://guest:guest@127.0.0.1:1//"
        CELERY_TASK_DEFAULT_QUEUE = "proj-b"
        CELERY_WORKER_PREFETCH_MULTIPLIER = 8

    app = Celery("proj", set_as_current=False)
    router().install(app)
    app.config_from_object(Settings, namespace="CELERY")
    assert app.conf.task_queue_max_priority == 10
    assert app.amqp.queues["proj-b"].queue_arguments == {"x-max-priority": 10}
    assert app.conf.worker_prefetch_multiplier == 8, "the user's own value is kept (and warned)"


def test_reconfiguring_a_configured_app_settles_again() -> None:
    app = Celery("a", set_as_current=False)
    app.config_from_object({"broker_url": "redis://127.0.0.1:1/0"})
    assert app.conf.broker_url
    r = router()
    receiver = r.install(app)
    assert receiver.transport is Transport.REDIS
    app.config_from_object({"broker_url": "amqp://guest:guest@127.0.0.1:1//"})
    assert app.conf.task_queue_max_priority == 10
    assert receiver.transport is Transport.AMQP


def test_sender_settings_changed_after_install_are_honoured() -> None:
    app = Celery("a", broker="redis://127.0.0.1:1/0", set_as_current=False)
    router().install(app)
    app.conf.task_publish_retry_policy = {"max_retries": 1, "interval_start": 0}
    app.conf.task_default_delivery_mode = "transient"
    send = app.amqp.send_task_message
    frozen = dict(zip(send.__wrapped__.__code__.co_freevars, send.__wrapped__.__closure__, strict=True))
    assert frozen["default_policy"].cell_contents == {"max_retries": 1, "interval_start": 0}
    assert frozen["default_delivery_mode"].cell_contents == "transient"


@needs_queue_type_setting
def test_quorum_default_queue_gets_no_max_priority(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("a", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False)
    app.conf.task_default_queue_type = "quorum"
    with caplog.at_level(logging.INFO, "priority_router"):
        router().install(app)
        assert app.amqp.default_queue.queue_arguments == {"x-queue-type": "quorum"}
    assert app.conf.task_queue_max_priority is None
    assert "quorum queues" in caplog.text and "4.0" in caplog.text


def test_a_queue_type_setting_this_celery_ignores_leaves_a_classic_queue(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Celery 5.4 has no task_default_queue_type and declares a classic queue whatever it
    says: that queue needs its max priority like any other (on a newer Celery, the router
    is shown a Celery without the setting)."""
    known = {k: v for k, v in rabbitmq.CELERY_DEFAULTS.items() if not k.endswith("_queue_type")}
    monkeypatch.setattr(rabbitmq, "CELERY_DEFAULTS", known)
    app = Celery("a", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False)
    app.conf.task_default_queue_type = "quorum"
    with caplog.at_level(logging.WARNING, "priority_router"):
        router().install(app)
    assert app.conf.task_queue_max_priority == AMQP_MAX_PRIORITY
    assert "quorum" not in caplog.text


def test_quorum_and_classic_queues_side_by_side() -> None:
    from kombu import Queue

    app = Celery("a", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False)
    app.conf.task_queues = [
        Queue("classic"),
        Queue("replicated", queue_arguments={"x-queue-type": "quorum"}),
    ]
    router().install(app)
    queues = app.amqp.queues
    assert queues["classic"].queue_arguments == {"x-max-priority": 10}
    assert queues["replicated"].queue_arguments == {"x-queue-type": "quorum"}


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


def test_the_apps_celery_settings_configure_the_router(caplog: pytest.LogCaptureFixture) -> None:
    class DjangoSettings:
        CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
        CELERY_PRIORITY_ROUTER_KEY_PREFIX = "dj:"
        CELERY_PRIORITY_ROUTER_RESET_INTERVAL = "900"  # read from the environment, say
        CELERY_PRIORITY_ROUTER_DEFAULT_PRIORITY = 7
        CELERY_PRIORITY_ROUTER_RESET_INTERVALL = 5

    app = Celery("proj", set_as_current=False)
    r = PriorityRouter(redis_client=fakeredis.FakeRedis(), default_priority=3)
    r.install(app)  # before the configuration exists
    with caplog.at_level(logging.WARNING, "priority_router"):
        app.config_from_object(DjangoSettings, namespace="CELERY")
        assert app.conf.broker_url
    assert r.config.key_prefix == "dj:" and r.config.reset_interval == 900
    assert r.config.default_priority == 3, "a setting given to the constructor wins"
    assert engine_of(r).counter.reset_interval_ms == 900_000
    assert "CELERY_PRIORITY_ROUTER_RESET_INTERVALL" in caplog.text and "not a setting it reads" in caplog.text
    assert "(did you mean CELERY_PRIORITY_ROUTER_RESET_INTERVAL?)" in caplog.text
    assert "written CELERY_PRIORITY_ROUTER_<NAME>" in caplog.text


@pytest.mark.parametrize(
    ("key", "suggested"),
    [
        ("CELERY_PRIORITY_ROUTER_REDISURL", "CELERY_PRIORITY_ROUTER_REDIS_URL"),
        ("priority_router_key_prefx", "priority_router_key_prefix"),
        ("PRIORITY_ROUTER_MODES", "priority_router_mode"),
        # The environment variable's name in a configuration module: Celery reads lower case.
        ("PRIORITY_ROUTER_MODE", "priority_router_mode"),
        ("priority_router_MODE", "priority_router_mode"),
    ],
)
def test_a_mistyped_setting_is_named_with_the_closest_one_as_the_user_writes_it(
    caplog: pytest.LogCaptureFixture, key: str, suggested: str
) -> None:
    """The name suggested is the one Celery reads: upper case in Django's CELERY_ namespace,
    lower case otherwise."""
    settings = type("Settings", (), {"CELERY_BROKER_URL": "redis://127.0.0.1:1/0", key: "x"})
    app = Celery("proj", set_as_current=False)
    router().install(app)
    with caplog.at_level(logging.WARNING, "priority_router"):
        app.config_from_object(settings, namespace="CELERY" if key.startswith("CELERY_") else None)
        app.conf.get("broker_url")  # loads the configuration
    assert f"ignores {key} (did you mean {suggested}?): not a setting it reads" in caplog.text


def test_a_bad_celery_setting_names_itself() -> None:
    app = Celery("proj", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.priority_router_reset_interval = -1
    assert app.conf.broker_url
    with pytest.raises(ConfigurationError) as info:
        router().install(app)
    assert "reset_interval" in str(info.value)


def test_one_router_on_apps_with_different_settings_says_so(caplog: pytest.LogCaptureFixture) -> None:
    first = Celery("first", broker="redis://127.0.0.1:1/0", set_as_current=False)
    first.conf.priority_router_reset_interval = 600
    second = Celery("second", broker="redis://127.0.0.1:1/0", set_as_current=False)
    second.conf.priority_router_reset_interval = 60
    r = router()
    r.install(first)
    assert first.conf.broker_url and r.config.reset_interval == 600
    with caplog.at_level(logging.ERROR, "priority_router"):
        r.install(second)
        assert second.conf.broker_url
    assert r.config.reset_interval == 600
    assert "one PriorityRouter per app" in caplog.text


def test_a_kept_queue_max_priority_is_warned_once_however_often_the_router_settles(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from kombu import Queue

    app = Celery("a", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False)
    app.conf.task_queues = [Queue("capped", queue_arguments={"x-max-priority": 5})]
    with caplog.at_level(logging.WARNING, "priority_router"):
        router().install(app)
        app.amqp._create_task_sender()  # the sender is built: the router settles again
        app.config_from_object({"task_default_queue": "capped"})
        assert app.conf.broker_url  # configuration reloaded: settles once more
    assert caplog.text.count("keeps your x-max-priority=5") == 1


def test_a_misspelt_environment_variable_is_named_with_the_closest_one(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIORITY_ROUTER_REDIS_ULR", "redis://10.0.0.5:6379/0")
    monkeypatch.setenv("PRIORITY_ROUTER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")  # the suite's own
    app = Celery("proj", set_as_current=False, broker="redis://127.0.0.1:1/0")
    router().install(app)
    with caplog.at_level(logging.WARNING, "priority_router"):
        assert app.conf.broker_url  # the app configures itself: the router reads its settings
    warnings = [r.getMessage() for r in caplog.records if "environment variable" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "PRIORITY_ROUTER_REDIS_ULR (did you mean PRIORITY_ROUTER_REDIS_URL?)" in warnings[0]
    assert "TEST_REDIS_URL" not in warnings[0]


def test_doctor_fails_a_misspelt_setting_the_router_ignores(monkeypatch: pytest.MonkeyPatch) -> None:
    from priority_router.ops import doctor

    monkeypatch.setenv("PRIORITY_ROUTER_REDIS_ULR", "redis://10.0.0.5:6379/0")
    app = Celery("proj", set_as_current=False, broker="redis://127.0.0.1:1/0")
    app.conf.priority_router_threshold = "wide"
    (finding,) = doctor._check_setting_names(app, Transport.REDIS)
    assert not finding.ok
    assert "priority_router_threshold (did you mean priority_router_thresholds?)" in finding.detail
    assert "PRIORITY_ROUTER_REDIS_ULR (did you mean PRIORITY_ROUTER_REDIS_URL?)" in finding.detail


def test_doctor_names_install_order_when_a_task_was_bound_before_the_router() -> None:
    """A Django trial bound its tasks (finalize, then read a task's acks_late) before
    install(): doctor blamed a decorator that set nothing."""
    from priority_router.ops import doctor

    app = Celery("proj", set_as_current=False, broker="redis://127.0.0.1:1/0")

    @app.task(name="bound-before-install")
    def bound() -> None:
        pass

    app.finalize(auto=True)
    assert bound.acks_late is False  # bound with Celery's default
    router().install(app)
    (finding,) = doctor._check_acks(app, Transport.REDIS)
    assert not finding.ok and "bound-before-install" in finding.detail
    assert "bound before install() set task_acks_late" in finding.fix
