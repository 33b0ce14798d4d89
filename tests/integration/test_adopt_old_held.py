"""An upgrade from a build that reported 0.1.0 (up to b0b0e69), workers first as
docs/lifecycle.md says: that release's gate held a document by storing its message in the
counter store (``{client}:msg``); a worker of this release adopts every such document into
the broker's custody, and each runs (docs/lifecycle.md, ``integration/adopt.py``).

The documents are held exactly as b0b0e69 held them: taken from the broker and passed to
that release's own ``gate.lua`` (``tests/support/gate_b0b0e69.lua``, its text at b0b0e69)
with the message stored in that release's form (``_pack`` below, its
``integration/redeliver.py``)."""

from __future__ import annotations

import base64
import importlib
import json
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import CliRunner
from kombu import Queue
from support.services import Worker, fast_redelivery, running_worker

from priority_router import PriorityRouter
from priority_router.integration.holding import Document, Holding
from priority_router.ops.cli import main
from priority_router.router import installed_router
from priority_router.store.client_ids import client_key, held_index_key

TRACK = "tests.track_running"
OLD_GATE = Path(__file__).parents[1] / "support" / "gate_b0b0e69.lua"
LEASE_MS = 2000


def _pack(message: Any) -> bytes:
    """b0b0e69's ``integration/redeliver.pack``: the stored form of a held message."""
    body = message.body
    raw = body.encode("utf-8", "surrogateescape") if isinstance(body, str) else bytes(body)
    properties = message.properties or {}
    info = message.delivery_info or {}
    stored = {
        "body": base64.b64encode(raw).decode("ascii"),
        "content_type": message.content_type,
        "content_encoding": message.content_encoding,
        "headers": message.headers or {},
        "properties": {
            k: properties[k]
            for k in ("priority", "correlation_id", "reply_to", "delivery_mode")
            if properties.get(k) is not None
        },
        "exchange": info.get("exchange") or "",
        "routing_key": info.get("routing_key") or "",
    }
    return json.dumps(stored, separators=(",", ":")).encode()


@pytest.fixture
def upgrade(
    worker_env: dict[str, str], producer: Callable[[], Celery]
) -> Iterator[tuple[dict[str, str], redis.Redis, redis.Redis, PriorityRouter, Celery]]:
    """The workers' environment, a hash where ``tests.track_running`` counts runs, the counter
    store, a router that capped ``bulk`` at 1, and a producer."""
    env = {
        **worker_env,
        "RUNS_REDIS_URL": worker_env["RESULT_BACKEND"],
        "RUNS_KEY": f"runs-{uuid.uuid4().hex[:8]}",
        "PRIORITY_ROUTER_LEASE": "5",
    }
    if env["BROKER_URL"].startswith("redis"):
        env["BROKER_TRANSPORT_OPTIONS"] = fast_redelivery(env)  # a dead worker's: after 3 s
    router = PriorityRouter.from_env(env)
    router.set_tier("bulk", max_in_flight=1)
    runs = redis.Redis.from_url(env["RUNS_REDIS_URL"])
    store = redis.Redis.from_url(env["PRIORITY_ROUTER_REDIS_URL"])
    yield env, runs, store, router, producer()
    for suffix in ("", ":stopped", ":done"):
        runs.delete(env["RUNS_KEY"] + suffix)
    runs.close()
    store.close()


def _hold_as_b0b0e69(app: Celery, env: dict[str, str], store: redis.Redis, n: int) -> tuple[list[Any], str]:
    """Publish ``n`` documents of ``bulk`` and hold them as a worker of b0b0e69 did (one of
    the client's ran, so that its cap of 1 holds the rest): each message taken from the
    broker, stored by that release's gate.lua, then acknowledged.  The documents, and the
    client's key base."""
    results = [app.send_task(TRACK, kwargs={"seconds": 0.05, "client_id": "bulk"}) for _ in range(n)]
    gate = store.register_script(OLD_GATE.read_text())
    base = client_key(env["PRIORITY_ROUTER_KEY_PREFIX"], "bulk")
    keys = [base + suffix for suffix in (":run", ":held", ":msg", ":gate")]

    def admit(task_id: str, message: bytes) -> int:
        now = int(time.time() * 1000)
        return int(
            gate(keys=keys, args=["admit", task_id, now, LEASE_MS, 1, -1, 0, 0, 0, 100, 1000, message])[0]
        )

    assert admit("ran-on-the-old-worker", b"{}") == 1
    taken = 0
    deadline = time.monotonic() + 30
    with app.connection_for_read() as connection:
        queue = Queue(env["DOCUMENT_QUEUE"])(connection.default_channel)
        while taken < n:
            assert time.monotonic() < deadline, f"only {taken} of {n} documents reached the queue"
            message = queue.get(no_ack=False)
            if message is None:
                time.sleep(0.05)
                continue
            assert admit(message.headers["id"], _pack(message)) == 0  # held: its message stored
            message.ack()
            taken += 1
    store.zadd(held_index_key(env["PRIORITY_ROUTER_KEY_PREFIX"]), {"bulk": int(time.time() * 1000)})
    assert store.hlen(base + ":msg") == n
    return results, base


def _runs(runs: redis.Redis, env: dict[str, str], results: list[Any]) -> list[int]:
    return [int(runs.hget(env["RUNS_KEY"], f"run:{r.id}") or 0) for r in results]


def _wait(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.parametrize(
    "broker_url", ["redis", pytest.param("amqp", marks=pytest.mark.rabbitmq)], indirect=True
)
def test_a_worker_of_this_release_runs_every_document_an_older_release_held_once_under_its_cap(
    upgrade: tuple[dict[str, str], redis.Redis, redis.Redis, PriorityRouter, Celery],
) -> None:
    env, runs, store, router, app = upgrade
    docs, base = _hold_as_b0b0e69(app, env, store, 20)
    with running_worker(env, "-P", "threads", "-c", "3") as worker:
        for doc in docs:
            doc.get(timeout=60)
        assert "adopted 20 document(s) of client 'bulk'" in worker.output(), worker.output()[-3000:]
    assert _runs(runs, env, docs) == [1] * len(docs)
    # Adopted into the holding queue, they ran one at a time, as the cap says.
    assert int(runs.hget(env["RUNS_KEY"], "max:bulk") or 0) == 1
    assert store.hlen(base + ":msg") == 0 and store.hlen(base + ":adopting") == 0
    _wait(lambda: router.gate_state("bulk").held == 0, "documents stayed counted held")


def test_documents_an_older_release_held_for_a_client_whose_limits_were_lifted_go_back_to_their_queue(
    upgrade: tuple[dict[str, str], redis.Redis, redis.Redis, PriorityRouter, Celery],
) -> None:
    env, runs, store, router, app = upgrade
    docs, base = _hold_as_b0b0e69(app, env, store, 12)
    router.unset_tier("bulk")
    with running_worker(env, "-P", "threads", "-c", "3") as worker:
        for doc in docs:
            doc.get(timeout=60)
        assert "no limits now, so they went back to their queue" in worker.output(), worker.output()[-3000:]
    assert _runs(runs, env, docs) == [1] * len(docs)
    assert store.hlen(base + ":msg") == 0 and store.hlen(base + ":adopting") == 0
    assert router.gate_state("bulk").held == 0
    assert store.hlen(base + ":msg") == 0 and store.hlen(base + ":adopting") == 0
    _wait(lambda: router.gate_state("bulk").held == 0, "documents stayed counted held")


@pytest.mark.parametrize(
    "broker_url", ["redis", pytest.param("amqp", marks=pytest.mark.rabbitmq)], indirect=True
)
def test_a_worker_killed_while_adopting_loses_none_and_the_next_one_adopts_the_rest(
    upgrade: tuple[dict[str, str], redis.Redis, redis.Redis, PriorityRouter, Celery],
) -> None:
    env, runs, store, router, app = upgrade
    docs, base = _hold_as_b0b0e69(app, env, store, 40)
    # Killed with the 5th adopted document published to the broker, not yet forgotten in the store.
    killing = {**env, "GATE_STEP": "adopt:published", "GATE_NTH": "5", "GATE_DO": "kill"}
    worker = Worker(killing, "-P", "threads", "-c", "3", app="killing_app")
    try:
        worker.wait_ready()
        worker.process.wait(timeout=60)
        assert worker.process.returncode == -signal.SIGKILL, worker.output()[-3000:]
    finally:
        worker.stop()
    assert runs.get(env["RUNS_KEY"] + ":stopped") == b"adopt:published"
    assert store.hlen(base + ":msg") + store.hlen(base + ":adopting") > len(docs) - 5
    with running_worker(env, "-P", "threads", "-c", "3"):
        for doc in docs:
            doc.get(timeout=120)
        _wait(
            lambda: store.hlen(base + ":msg") + store.hlen(base + ":adopting") == 0,
            "documents left in the store",
        )
    ran = _runs(runs, env, docs)
    assert min(ran) >= 1, ran
    # The one published when the worker died may run twice (at least once), no other.
    assert sum(ran) <= len(docs) + 1, ran
    _wait(lambda: router.gate_state("bulk").held == 0, "documents stayed counted held")


def _invoke(*args: str) -> tuple[int, Any]:
    result = CliRunner().invoke(main, list(args))
    if "--json" not in args:
        return result.exit_code, result.output
    try:
        return result.exit_code, json.loads(result.output)
    except json.JSONDecodeError:
        raise AssertionError(result.output) from None


def _app(name: str) -> Celery:
    return importlib.import_module(name).app  # type: ignore[no-any-return]


def test_status_inspect_and_doctor_name_documents_an_older_release_holds_in_the_store(
    app_module: Callable[..., str], broker_url: str, counter_url: str, key_prefix: str
) -> None:
    name = app_module(broker_url, f"q-{uuid.uuid4().hex[:8]}")
    store = redis.Redis.from_url(counter_url)
    gate = store.register_script(OLD_GATE.read_text())
    keys = [client_key(key_prefix, "bulk") + suffix for suffix in (":run", ":held", ":msg", ":gate")]
    now = int(time.time() * 1000)
    for task_id in ("running", "held-1", "held-2", "held-3"):
        gate(keys=keys, args=["admit", task_id, now, 30_000, 1, -1, 0, 0, 0, 100, 1000, b"{}"])
    assert store.hlen(keys[2]) == 3
    _, shown = _invoke("status", "-A", name)
    assert "3 document(s) are held by an older release's workers" in " ".join(shown.split()), shown
    _, one = _invoke("inspect", "bulk", "-A", name, "--json")
    assert one["held_by_older_release"] == 3
    code, findings = _invoke("doctor", "-A", name, "--json")
    (found,) = [f for f in findings if f["check"] == "held documents"]
    assert not found["ok"] and "'bulk' (3)" in found["detail"], found
    assert found["fix"].startswith("start a worker of this release")
    assert code != 0


def test_doctor_names_a_holding_queue_whose_documents_the_store_does_not_count(
    app_module: Callable[..., str], broker_url: str, counter_url: str, key_prefix: str
) -> None:
    """A rollback to a build that held documents in the store: its workers zero the held
    count of documents this release holds in the broker, and `status` shows none held."""
    name = app_module(broker_url, f"q-{uuid.uuid4().hex[:8]}")
    app = _app(name)
    router = installed_router(app)
    assert router is not None
    router.set_tier("bulk", max_in_flight=1)
    holding = Holding(app, key_prefix)
    try:
        for n in range(2):
            document = Document(b"[[], {}, {}]", {"id": f"t{n}"}, "application/json", "utf-8", "", "q", {})
            holding.hold_document(document, f"t{n}", "bulk", first=n == 0)
        code, findings = _invoke("doctor", "-A", name, "--json")
        (found,) = [f for f in findings if f["check"] == "held documents"]
        assert "'bulk' (2 in its holding queue, 0 counted)" in found["detail"], found
        assert found["fix"].startswith("start a worker of this release")
        assert code != 0
    finally:
        with holding._using() as channel:
            for queue in (holding.queue("bulk"), holding.index()):
                channel.queue_delete(queue.name)
        holding.close()
