"""Real services for the tests: find them, or start throwaway ones."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from typing import Any

from workers.local_redis import (  # noqa: F401 - re-exported for the tests
    EmbeddedRedis,
    RedisDatabases,
    free_port,
    redis_answers,
    start_embedded_redis,
    stop_process,
)
from workers.services import (  # noqa: F401 - re-exported for the tests
    ROOT,
    Flower,
    LoggedProcess,
    Worker,
    ensure_rabbitmq,
    fast_redelivery,
    running_worker,
    tcp_answers,
    temporary_vhost,
    worker_command,
    worker_environment,
)

IN_CI = bool(os.environ.get("CI"))

#: The Redis the tests use: ``PRIORITY_ROUTER_TEST_REDIS_URL``, else ``REDIS_URL`` (the one
#: ``make demo`` reads), else the local one; a throwaway one when it does not answer.  A
#: database number in it chooses the first of the three consecutive databases the tests
#: use (``redis://127.0.0.1:6379/3``: 3, 4 and 5); without one they are 13, 14 and 15.
TEST_REDIS_URL = (
    os.environ.get("PRIORITY_ROUTER_TEST_REDIS_URL")
    or os.environ.get("REDIS_URL")
    or "redis://127.0.0.1:6379"
)
#: pytest-xdist's name for this process ("gw0", "gw1", ...; ``make test`` runs several), or
#: None in a plain ``pytest`` run.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")


def _own_databases(configured: RedisDatabases) -> RedisDatabases:
    """The three databases of this xdist process: the configured ones for the first, the
    three below them for the next and so on (13-15, 10-12, 7-9, ...; upwards from a low
    first database), so processes never share a broker's keys, a key sweep or a
    remote-control channel."""
    if XDIST_WORKER is None:
        return configured
    n = int(XDIST_WORKER.removeprefix("gw"))
    first = configured.first - 3 * n if configured.first >= 3 * n else configured.first + 3 * n
    if first + 2 > 15:
        raise RuntimeError(
            f"pytest-xdist process {XDIST_WORKER} has no three Redis databases of its own left "
            f"(from database {configured.first} of {TEST_REDIS_URL}): run fewer processes (-n)"
        )
    return RedisDatabases(configured.server, first, configured.query)


TEST_DATABASES = _own_databases(RedisDatabases.from_url(TEST_REDIS_URL))
#: The router's counter store, the Celery broker and the result backend of every test.
COUNTER_DB, BROKER_DB, RESULTS_DB = TEST_DATABASES.numbers


def counter_db_url(server: str) -> str:
    """The counter store's URL on ``server`` (the ``redis_server_url`` fixture)."""
    return TEST_DATABASES.on(server).counter


def broker_db_url(server: str) -> str:
    """The Celery broker's URL on ``server`` (the ``redis_server_url`` fixture)."""
    return TEST_DATABASES.on(server).broker


def results_db_url(server: str) -> str:
    """The result backend's URL on ``server`` (the ``redis_server_url`` fixture)."""
    return TEST_DATABASES.on(server).results


def kill_worker_mid_work(env: Mapping[str, str], *args: str, received: int = 2, timeout: float = 60) -> None:
    """Start a worker, let it receive ``received`` documents and start on them, then SIGKILL it."""
    worker = Worker(env, *args)
    try:
        worker.wait_ready()
        deadline = time.monotonic() + timeout
        while worker.output().count("received") < received:
            assert time.monotonic() < deadline, worker.output()
            time.sleep(0.05)
        time.sleep(0.3)
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait()
    finally:
        worker.stop()


#: Apps the tests closed, kept referenced until the session ends (see close_app).
_CLOSED_APPS: list[Any] = []


def close_app(app: Any) -> None:
    """``app.close()``, keeping the app referenced for the rest of the session.

    Celery's close leaves sockets open (the result backend's pub/sub connection, pooled
    broker connections).  Since the router no longer keeps apps alive, a closed app is
    garbage-collected at some later point, and its sockets then raise ResourceWarning
    (an error here) in whichever unrelated test is running.  The library's own part,
    that an app can be collected at all, is tested in tests/unit/test_install.py.
    """
    app.close()
    _CLOSED_APPS.append(app)
