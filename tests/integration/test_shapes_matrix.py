"""The shapes matrix: every worker pool x both brokers x every settings source, each row a
real publisher, a real worker and the commands a user runs next, as separate processes.

Each row's router settings (a store in its own database and key prefix, ``mode="inflight"``)
come only from the row's source (``shapes/matrix_app.py``), so a command or a worker that
ignores that source reads another store and the row fails.  ``make test`` runs the rows
marked ``fast``; ``make shapes`` runs them all.
"""

from __future__ import annotations

import collections
import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
from kombu import Connection
from support.services import ROOT, Worker, broker_db_url, counter_db_url, stop_process, worker_environment

POOLS = {"prefork": 2, "threads": 4, "solo": 1, "gevent": 20, "eventlet": 20}
BROKERS = ("redis", "amqp")
SOURCES = ("constructor", "environment", "celery", "django")
#: One row per pool, every source and both brokers among them: the part ``make test`` runs.
FAST = {
    ("prefork", "redis", "constructor"),
    ("threads", "amqp", "celery"),
    ("gevent", "redis", "django"),
    ("eventlet", "redis", "environment"),
}
#: The rows of the Celery matrix (make matrix): a green pool, and RabbitMQ on the newest Celery.
COMPAT = {("gevent", "redis", "django"), ("threads", "amqp", "celery")}
HEAVY, LIGHT = 40, 3


def _rows() -> Iterator[object]:
    for pool in POOLS:
        for broker in BROKERS:
            for source in SOURCES:
                marks = [pytest.mark.rabbitmq] if broker == "amqp" else []
                if (pool, broker, source) not in FAST:
                    marks.append(pytest.mark.matrix)
                if (pool, broker, source) in COMPAT:
                    marks.append(pytest.mark.compat)
                yield pytest.param(pool, broker, source, marks=marks, id=f"{pool}-{broker}-{source}")


@dataclass
class Row:
    pool: str
    env: dict[str, str]
    store: redis.Redis
    runs_key: str

    def command(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``priority-router ARGS`` as a user runs it, in a process of its own."""
        return subprocess.run(
            [sys.executable, "-m", "priority_router", *args],
            cwd=ROOT,
            env=worker_environment(self.env),
            capture_output=True,
            text=True,
            timeout=120,
        )

    def json(self, *args: str) -> object:
        done = self.command(*args, "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    def runs(self) -> list[tuple[str, str, float]]:
        return [tuple(json.loads(r)) for r in self.store.lrange(self.runs_key, 0, -1)]  # type: ignore[misc, union-attr]


@pytest.fixture
def row(request: pytest.FixtureRequest, redis_server_url: str, key_prefix: str) -> Iterator[Row]:
    pool, broker, source = request.node.callspec.params.values()
    broker_url = broker_db_url(redis_server_url) if broker == "redis" else request.getfixturevalue("amqp_url")
    store_url = counter_db_url(redis_server_url)
    queue = f"matrix-{uuid.uuid4().hex[:8]}"
    env = {
        "SHAPE_SOURCE": source,
        "SHAPE_STORE_URL": store_url,
        "SHAPE_KEY_PREFIX": key_prefix,
        "SHAPE_RUNS_URL": store_url,
        "SHAPE_RUNS_KEY": f"{key_prefix}runs",
        "BROKER_URL": broker_url,
        "DOCUMENT_QUEUE": queue,
    }
    if source == "environment":
        env |= {
            "PRIORITY_ROUTER_REDIS_URL": store_url,
            "PRIORITY_ROUTER_KEY_PREFIX": key_prefix,
            "PRIORITY_ROUTER_MODE": "inflight",
            "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
        }
    store = redis.Redis.from_url(store_url)
    yield Row(pool, env, store, env["SHAPE_RUNS_KEY"])
    store.delete(env["SHAPE_RUNS_KEY"])
    with contextlib.suppress(Exception), Connection(broker_url) as conn:
        conn.default_channel.queue_delete(queue)


@pytest.mark.parametrize(("pool", "broker", "source"), list(_rows()))
def test_shape(row: Row, pool: str, broker: str, source: str) -> None:
    if pool in ("gevent", "eventlet"):
        pytest.importorskip(pool, reason=f"the {pool} pool needs `pip install {pool}`")
    published = subprocess.run(
        [sys.executable, "-m", "shapes.matrix_publish", str(HEAVY), str(LIGHT)],
        cwd=ROOT,
        env=worker_environment(row.env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert published.returncode == 0, published.stderr

    # The commands read the store the publishes wrote, from the app's own settings.
    app = ("-A", "shapes.matrix_app")
    status = row.json(*app, "status")
    assert isinstance(status, list)
    heavy = next(r for r in status if r["client_id"] == "heavy")
    assert (heavy["pending"], heavy["priority"], heavy["in_flight"]) == (1 - HEAVY, 9, HEAVY)
    inspected = row.json(*app, "inspect", "light0")
    assert isinstance(inspected, dict)
    assert inspected["tracked"] and inspected["key"].startswith(row.env["SHAPE_KEY_PREFIX"])
    doctor = row.command(*app, "doctor", "-P", pool, "-c", str(POOLS[pool]), "--json")
    failed = [f for f in json.loads(doctor.stdout) if not f["ok"]]
    assert doctor.returncode == 0 and not failed, failed

    worker = Worker(row.env, "--pool", pool, "--concurrency", str(POOLS[pool]), app="shapes.matrix_app")
    try:
        worker.wait_ready()
        deadline = time.monotonic() + 120
        while len(row.runs()) < HEAVY + LIGHT and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # a document delivered again would run by now
        stop_process(worker.process, timeout=30)  # a warm shutdown, as an operator's
        log = worker.output()
    finally:
        worker.stop()

    runs = row.runs()
    counts = collections.Counter(doc for doc, _, _ in runs)
    assert len(counts) == HEAVY + LIGHT, f"{len(counts)} of {HEAVY + LIGHT} documents ran:\n{log}"
    assert [doc for doc, n in counts.items() if n > 1] == [], f"documents ran twice:\n{log}"
    assert "CRITICAL" not in log and "Couldn't ack" not in log, log
    order = [client for _, client, _ in sorted(runs, key=lambda r: r[2])]
    # The heavy client's first 3 documents share priority 1 with the light ones and were
    # published first; a worker may hold its pool's worth (and a green pool one more).
    bound = 3 + LIGHT + POOLS[pool] + 1
    assert all(order.index(f"light{n}") < bound for n in range(LIGHT)), order
    assert "priority-router on 'matrix': mode=inflight" in log, log
    assert f"{pool} pool" in log, log

    # The worker ended every document in the same store: nothing is left in flight.
    assert row.json(*app, "status") == []
