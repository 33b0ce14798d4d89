from __future__ import annotations

import contextlib
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import CliRunner, Result
from support.redis_sweep import delete_prefixed
from support.services import broker_db_url, close_app, counter_db_url, results_db_url

from priority_router.ops.cli import main
from workers.app import create_app

pytestmark = pytest.mark.integration


@pytest.fixture(params=["redis", pytest.param("amqp", marks=pytest.mark.rabbitmq)])
def broker_url(request: pytest.FixtureRequest, redis_server_url: str) -> str:
    if request.param == "redis":
        return broker_db_url(redis_server_url)
    return str(request.getfixturevalue("amqp_url"))


@pytest.fixture
def worker_env(broker_url: str, redis_server_url: str, key_prefix: str) -> Iterator[dict[str, str]]:
    """Environment for one test's producer and workers: its own queue and counter keys
    (deleted after it; the session sweep catches its results and the broker's keys)."""
    yield {
        "BROKER_URL": broker_url,
        "RESULT_BACKEND": results_db_url(redis_server_url),
        "DOCUMENT_QUEUE": f"documents-{uuid.uuid4().hex[:8]}",
        "PRIORITY_ROUTER_REDIS_URL": counter_db_url(redis_server_url),
        "PRIORITY_ROUTER_KEY_PREFIX": key_prefix,
        "WORKER_INCLUDE": "worker_tasks",
        # The publisher's background check for blind workers is tested on its own
        # (test_deployment_shapes); elsewhere it would only add broadcasts between tests.
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
    }
    _delete_counters(counter_db_url(redis_server_url), key_prefix)


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
def counter_url(redis_server_url: str, key_prefix: str) -> Iterator[str]:
    """The counter store the CLI tests use; the test's ``key_prefix`` keys are deleted after it."""
    url = counter_db_url(redis_server_url)
    yield url
    _delete_counters(url, key_prefix)


def _delete_counters(url: str, key_prefix: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        delete_prefixed(client, key_prefix)
    finally:
        client.close()


@pytest.fixture
def cli(counter_url: str, key_prefix: str) -> Callable[..., Result]:
    """``priority-router --redis-url ... --key-prefix ... ARGS`` in-process, as a user runs it."""
    runner = CliRunner()

    def run(*args: str, input: str | None = None) -> Result:
        return runner.invoke(
            main, ["--redis-url", counter_url, "--key-prefix", key_prefix, *args], input=input
        )

    return run


#: ``make(broker, queue, settings=None, install=True)``: the import name of a new app module.
AppFactory = Callable[..., str]


@pytest.fixture
def app_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_server_url: str, key_prefix: str
) -> Iterator[AppFactory]:
    """Writes a Celery app module the CLI loads with ``-A``; returns its import name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded: list[str] = []

    def make(
        broker: str, queue: str, settings: dict[str, Any] | None = None, install: bool = True, tasks: str = ""
    ) -> str:
        """``tasks``: names of tasks the app registers, comma-separated."""
        name = f"cli_app_{uuid.uuid4().hex[:8]}"
        registered = "".join(
            f"\n\n@app.task(name={task!r})\ndef task_{n}() -> None: ...\n"
            for n, task in enumerate(t for t in tasks.split(",") if t)
        )
        (tmp_path / f"{name}.py").write_text(
            textwrap.dedent(
                f"""
                from celery import Celery
                from priority_router import PriorityRouter

                app = Celery({name!r})
                app.conf.update(broker_url={broker!r}, task_default_queue={queue!r})
                app.conf.update({settings or {}!r})

                if {install!r}:
                    PriorityRouter(
                        redis_url={counter_db_url(redis_server_url)!r}, key_prefix={key_prefix!r}
                    ).install(app)
                """
            )
            + registered
        )
        loaded.append(name)
        return name

    yield make
    for name in loaded:
        module = sys.modules.pop(name, None)
        if module is not None:
            with contextlib.suppress(Exception):
                _purge(module.app)


def _purge(app: Celery) -> None:
    with app.connection_for_write() as conn:
        for queue in app.amqp.queues.values():
            with contextlib.suppress(Exception):
                queue.bind(conn.default_channel).delete()
    close_app(app)
