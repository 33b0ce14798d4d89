"""max_wait: the setting, its refusal on RabbitMQ and the worker's sweeper (no broker needed)."""

from __future__ import annotations

import logging
import time

import fakeredis
import pytest
from celery import Celery

from priority_router import ConfigurationError, PriorityRouter, RouterConfig
from priority_router.config import celery_values, env_values
from priority_router.integration.starvation import Sweeper, sweep_interval

AMQP = "amqp://guest:guest@127.0.0.1:1//"


def test_max_wait_is_off_by_default_and_read_from_every_source() -> None:
    assert RouterConfig().max_wait is None
    assert RouterConfig(max_wait=3).max_wait == 3.0
    assert env_values({"PRIORITY_ROUTER_MAX_WAIT": "2.5"}) == {"max_wait": 2.5}
    assert env_values({"PRIORITY_ROUTER_MAX_WAIT": "none"}) == {"max_wait": None}
    assert celery_values({"priority_router_max_wait": "300"}) == {"max_wait": 300.0}


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "3"])
def test_max_wait_must_be_positive_seconds(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"^max_wait: .* is not a positive number of seconds"):
        RouterConfig(max_wait=bad)  # type: ignore[arg-type]


def test_bad_max_wait_text_names_the_variable() -> None:
    with pytest.raises(ConfigurationError, match="PRIORITY_ROUTER_MAX_WAIT"):
        RouterConfig.from_env({"PRIORITY_ROUTER_MAX_WAIT": "soon"})


def router(**settings: object) -> PriorityRouter:
    return PriorityRouter(redis_client=fakeredis.FakeRedis(), consumer_check_interval=0, **settings)


def test_max_wait_is_refused_on_rabbitmq_at_install() -> None:
    app = Celery("a", broker=AMQP, set_as_current=False)
    app.loader.import_default_modules()
    app.conf.finalize()
    assert app.configured
    r = router(max_wait=60)
    with pytest.raises(ConfigurationError) as caught:
        r.install(app)
    text = str(caught.value)
    assert text.startswith("max_wait: is not supported on RabbitMQ")
    assert "head of the queue" in text and "Fix: use a Redis broker" in text
    assert r.uninstall(app) is None and not app.__dict__.get("_priority_router_installation")


def test_a_publisher_found_on_rabbitmq_later_keeps_its_priorities_and_says_max_wait_is_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Celery("a", broker=AMQP, set_as_current=False)
    r = router()
    receiver = r.install(app)  # not configured yet: the broker is known only when it is
    app.conf.priority_router_max_wait = 30
    with caplog.at_level(logging.ERROR, "priority_router"):
        app.conf.finalize()  # configures the app: the router settles
        app.conf.finalize()
    # max_wait only changes workers; this publisher's priorities stay on.
    assert receiver.unroutable is None and receiver.transport is not None
    assert caplog.text.count("max_wait: is not supported on RabbitMQ") == 1
    assert "Its workers refuse to start" in caplog.text and "Fix: use a Redis broker" in caplog.text


def test_max_wait_is_accepted_on_redis() -> None:
    app = Celery("a", broker="redis://127.0.0.1:1/0", set_as_current=False)
    r = router(max_wait=5)
    r.install(app)
    try:
        assert r.config.max_wait == 5.0
    finally:
        r.uninstall(app)


def test_sweep_interval_is_a_quarter_of_max_wait_within_bounds() -> None:
    assert sweep_interval(2) == 0.5
    assert sweep_interval(0.01) == 0.05
    assert sweep_interval(3600) == 1.0


def test_a_failing_sweep_is_logged_once_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("a", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.broker_connection_retry = False
    sweeper = Sweeper(app, 0.2, lambda: ["documents"])
    with caplog.at_level(logging.DEBUG, "priority_router"):
        sweeper.start()
        time.sleep(0.6)
        sweeper.stop()
    assert not sweeper._thread.is_alive()
    # Only this sweeper's: another test's daemon thread may log in the same window.
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "max_wait" in r.getMessage()]
    assert len(warnings) == 1 and "max_wait sweep failed" in warnings[0].getMessage()
    app.close()
