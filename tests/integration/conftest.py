from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable

import pytest
from celery import Celery
from click.testing import CliRunner, Result
from support.services import close_app

from priority_router.ops.cli import main
from workers.app import create_app

pytestmark = pytest.mark.integration


@pytest.fixture(params=["redis", pytest.param("amqp", marks=pytest.mark.rabbitmq)])
def broker_url(request: pytest.FixtureRequest, redis_server_url: str) -> str:
    if request.param == "redis":
        return redis_server_url + "/14"
    return str(request.getfixturevalue("amqp_url"))


@pytest.fixture
def worker_env(broker_url: str, redis_server_url: str, key_prefix: str) -> dict[str, str]:
    """Environment for one test's producer and workers: its own queue and counter keys."""
    return {
        "BROKER_URL": broker_url,
        "RESULT_BACKEND": redis_server_url + "/15",
        "DOCUMENT_QUEUE": f"documents-{uuid.uuid4().hex[:8]}",
        "PRIORITY_ROUTER_REDIS_URL": redis_server_url + "/13",
        "PRIORITY_ROUTER_KEY_PREFIX": key_prefix,
        "WORKER_INCLUDE": "worker_tasks",
        # The publisher's background check for blind workers is tested on its own
        # (test_deployment_shapes); elsewhere it would only add broadcasts between tests.
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
    }


@pytest.fixture
def producer(worker_env: dict[str, str]) -> Callable[[], Celery]:
    apps: list[Celery] = []

    def make() -> Celery:
        app = create_app(worker_env)
        apps.append(app)
        return app

    yield make  # type: ignore[misc]
    for app in apps:
        with app.connection_for_write() as conn, contextlib.suppress(Exception):
            conn.default_channel.queue_delete(worker_env["DOCUMENT_QUEUE"])
        close_app(app)


@pytest.fixture
def counter_url(redis_server_url: str) -> str:
    """The counter store the CLI tests use."""
    return redis_server_url + "/13"


@pytest.fixture
def cli(counter_url: str, key_prefix: str) -> Callable[..., Result]:
    """``priority-router --redis-url ... --key-prefix ... ARGS`` in-process, as a user runs it."""
    runner = CliRunner()

    def run(*args: str, input: str | None = None) -> Result:
        return runner.invoke(
            main, ["--redis-url", counter_url, "--key-prefix", key_prefix, *args], input=input
        )

    return run
