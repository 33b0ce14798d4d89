from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest
import redis
from support.cluster import LocalCluster, require_cluster_programs, running_cluster
from support.redis_sweep import KeySweep, delete_prefixed
from support.services import (
    IN_CI,
    TEST_DATABASES,
    XDIST_WORKER,
    counter_db_url,
    ensure_rabbitmq,
    redis_answers,
    start_embedded_redis,
    temporary_vhost,
)

AMQP_URL = os.environ.get("PRIORITY_ROUTER_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")

#: What the session's key sweep did, for the terminal summary.
_SWEEP_REPORT: list[str] = []


@pytest.fixture(scope="session", autouse=True)
def _leave_redis_as_found() -> Iterator[None]:
    """Delete, when the session ends, every key the tests created in the configured Redis's
    three databases (support/redis_sweep.py); the keys that were there are left alone.
    Set up first, so torn down last: after every fixture that could still write."""
    if not redis_answers(TEST_DATABASES.counter):
        yield  # the tests start a throwaway Redis when they need one, and stop it
        return
    sweep = KeySweep(TEST_DATABASES)
    sweep.start()
    try:
        yield
    finally:
        _SWEEP_REPORT.append(sweep.finish())


INTEGRATION = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``compat`` (the Celery matrix, noxfile.py) is every unit and contract test, and the
    integration tests marked with it."""
    for item in items:
        if INTEGRATION not in item.path.parents:
            item.add_marker(pytest.mark.compat)


#: Seconds spent per test file (setup, call and teardown), for the terminal summary.
_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::")[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _SWEEP_REPORT:
        terminalreporter.write_line(f"priority-router tests: {line}")
    total = sum(_FILE_SECONDS.values())
    if total >= 60:  # a long run: say where its time went
        processes = terminalreporter.config.getoption("numprocesses", None) or 0
        spread = f", {total:.0f} s over {processes} processes" if processes > 1 else ""
        terminalreporter.write_sep("-", f"where the time went: the 15 slowest files{spread}")
        for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:15]:
            terminalreporter.write_line(f"{seconds:7.1f} s {100 * seconds / total:5.1f}%  {path}")
        unit = sum(v for k, v in _FILE_SECONDS.items() if not k.startswith("tests/integration/"))
        terminalreporter.write_line(f"{unit:7.1f} s {100 * unit / total:5.1f}%  every unit and contract test")


@pytest.fixture(scope="session")
def redis_server_url() -> Iterator[str]:
    """A real Redis, without a database (``counter_db_url()`` and the like add one): the
    configured one when it answers, else a throwaway one."""
    if redis_answers(TEST_DATABASES.counter):
        yield TEST_DATABASES.server
        return
    server = start_embedded_redis()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def amqp_url() -> Iterator[str]:
    """The RabbitMQ the tests use; under pytest-xdist, a vhost of this process's own, so
    processes never hear each other's workers on the remote-control exchanges."""
    reason = ensure_rabbitmq(AMQP_URL)
    if reason is not None:
        if IN_CI:
            pytest.fail(f"RabbitMQ is required in CI: {reason}")
        pytest.skip(reason)
    if XDIST_WORKER is None:
        yield AMQP_URL
        return
    with temporary_vhost(AMQP_URL, f"pr-test-{XDIST_WORKER}") as url:
        if url == AMQP_URL:
            pytest.fail(
                "make test runs its RabbitMQ tests in parallel, each process on a vhost of its own, "
                "and rabbitmqctl could not make one: run it where rabbitmqctl works, or in one "
                "process: make test TEST_PROCESSES=0"
            )
        yield url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A throwaway local Redis Cluster: 3 masters, each with a replica.  Tests that kill a
    node start their own with ``running_cluster()``."""
    require_cluster_programs()
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
def real_redis(redis_server_url: str, key_prefix: str) -> Iterator[redis.Redis]:
    """The counter database; the test's ``key_prefix`` keys are deleted after it."""
    client = redis.Redis.from_url(counter_db_url(redis_server_url))
    yield client
    delete_prefixed(client, key_prefix)
    client.close()


@pytest.fixture
def fake_redis() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


@pytest.fixture
def key_prefix() -> str:
    """A prefix no other test shares, so tests never see each other's clients."""
    return f"pr-test-{uuid.uuid4().hex[:10]}:"
