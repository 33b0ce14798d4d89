"""``priority-router migrate QUEUE --to plain|router`` on the Redis broker, with real Redis,
real router publishes, real plain workers and a SIGKILLed command."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from celery import Celery
from click.testing import CliRunner
from support.services import ROOT, Worker, broker_db_url, counter_db_url, worker_environment

from priority_router.ops.cli import main
from priority_router.router import engine_of
from workers.app import create_app

SEP = "\x06\x16"


@pytest.fixture
def broker_url(redis_server_url: str) -> str:
    """Redis only: the RabbitMQ half has its own tests."""
    return broker_db_url(redis_server_url)


@pytest.fixture
def broker(redis_server_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(broker_db_url(redis_server_url))
    yield client
    client.close()


@pytest.fixture
def queue(broker: redis.Redis) -> Iterator[str]:
    name = f"migrate-{uuid.uuid4().hex[:8]}"
    yield name
    broker.delete(name, *(f"{name}{SEP}{step}" for step in range(1, 10)))


def key(queue: str, step: int) -> str:
    return queue if step == 0 else f"{queue}{SEP}{step}"


def depths(client: redis.Redis, queue: str) -> dict[int, int]:
    return {step: int(client.llen(key(queue, step))) for step in range(10)}


def migrate(broker_url: str, *args: str) -> dict[str, object]:
    result = CliRunner().invoke(main, ["migrate", *args, "-b", broker_url, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def serving_order(client: redis.Redis, name: str) -> list[str]:
    """A list's messages in the order a worker's BRPOP takes them (tail first)."""
    return [m.decode() for m in reversed(client.lrange(name, 0, -1))]


def test_to_plain_moves_each_unpolled_list_into_the_next_polled_one_in_order(
    broker: redis.Redis, queue: str, redis_server_url: str
) -> None:
    # kombu LPUSHes, so a list's first pushed message is the oldest, served first.
    for step in range(10):
        for n in range(3):
            broker.lpush(key(queue, step), f"p{step}-{n}")

    report = migrate(broker_db_url(redis_server_url), queue, "--to", "plain")

    assert report["changed"] is True and report["moved"] == 18
    assert depths(broker, queue) == {0: 3, 1: 0, 2: 0, 3: 9, 4: 0, 5: 0, 6: 9, 7: 0, 8: 0, 9: 9}
    for into, sources in ((3, (1, 2)), (6, (4, 5)), (9, (7, 8))):
        expected = [f"p{s}-{n}" for s in (*sources, into) for n in range(3)]
        assert serving_order(broker, key(queue, into)) == expected
    assert serving_order(broker, queue) == ["p0-0", "p0-1", "p0-2"]


def test_to_plain_again_moves_nothing_and_says_so(
    broker: redis.Redis, queue: str, redis_server_url: str
) -> None:
    broker.lpush(key(queue, 4), "a", "b")
    url = broker_db_url(redis_server_url)
    assert migrate(url, queue, "--to", "plain")["moved"] == 2

    again = migrate(url, queue, "--to", "plain")

    assert again["changed"] is False and again["moved"] == 0
    assert "no message waits in a list plain workers skip" in json.dumps(again["steps"])


def test_dry_run_plans_and_moves_nothing(broker: redis.Redis, queue: str, redis_server_url: str) -> None:
    broker.lpush(key(queue, 1), "a", "b")
    broker.lpush(key(queue, 8), "c")

    result = CliRunner().invoke(
        main, ["migrate", queue, "--to", "plain", "-b", broker_db_url(redis_server_url), "--dry-run"]
    )

    assert result.exit_code == 0, result.output
    assert "would move: 2 message(s) from lists 1, 2 into list 3" in result.output
    assert "would move: 1 message(s) from lists 7, 8 into list 9" in result.output
    assert depths(broker, queue)[1] == 2 and depths(broker, queue)[8] == 1


def test_to_router_on_redis_needs_no_move(broker: redis.Redis, queue: str, redis_server_url: str) -> None:
    broker.lpush(key(queue, 6), "a")

    result = CliRunner().invoke(
        main, ["migrate", queue, "--to", "router", "-b", broker_db_url(redis_server_url)]
    )

    assert result.exit_code == 0, result.output
    assert "router's workers poll every priority list" in result.output
    assert depths(broker, queue)[6] == 1


def test_migrate_needs_an_app_or_a_broker() -> None:
    result = CliRunner().invoke(main, ["migrate", "q", "--to", "plain"])
    assert result.exit_code == 2
    assert "--broker" in result.output


def test_a_killed_migration_loses_and_copies_nothing_and_a_rerun_finishes(
    broker: redis.Redis, queue: str, redis_server_url: str
) -> None:
    sources = (1, 2, 4, 5, 7, 8)
    for step in sources:
        broker.lpush(key(queue, step), *(f"p{step}-{n}" for n in range(4000)))
    url = broker_db_url(redis_server_url)
    command = [sys.executable, "-m", "priority_router", "migrate", queue, "--to", "plain", "-b", url]

    for killed in range(3):
        process = subprocess.Popen([*command, "--batch", "1"], cwd=ROOT, env=worker_environment({}))
        # Kill it once it is part way: some moved, some not.
        deadline = time.monotonic() + 60
        while sum(depths(broker, queue)[s] for s in (3, 6, 9)) < 2000 * (killed + 1):
            assert time.monotonic() < deadline and process.poll() is None, "the migration never got going"
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert sum(depths(broker, queue)[s] for s in sources) > 0, "finished before it could be killed"

    subprocess.run(command, cwd=ROOT, env=worker_environment({}), check=True, capture_output=True)

    for into, (first, second) in ((3, (1, 2)), (6, (4, 5)), (9, (7, 8))):
        served = serving_order(broker, key(queue, into))
        assert served == [f"p{s}-{n}" for s in (first, second) for n in range(4000)]
    assert all(depths(broker, queue)[s] == 0 for s in sources)


@pytest.fixture
def runs(redis_server_url: str, key_prefix: str) -> Iterator[Callable[[], dict[str, int]]]:
    client = redis.Redis.from_url(counter_db_url(redis_server_url))
    runs_key = f"{key_prefix}:runs"

    def read() -> dict[str, int]:
        return {k.decode(): int(v) for k, v in client.hgetall(runs_key).items()}

    yield read
    client.delete(runs_key)
    client.close()


def test_switching_off_under_plain_workers_runs_every_document_once(
    worker_env: dict[str, str],
    redis_server_url: str,
    key_prefix: str,
    broker: redis.Redis,
    runs: Callable[[], dict[str, int]],
) -> None:
    queue = worker_env["DOCUMENT_QUEUE"]
    env = {**worker_env, "RUNS_REDIS_URL": counter_db_url(redis_server_url), "RUNS_KEY": f"{key_prefix}:runs"}
    publisher: Celery = create_app(env)
    # Twelve clients of 22 documents: each goes through all nine priorities.
    ids = [
        publisher.send_task("tests.count_run", kwargs={"client_id": f"client-{c}"}).id
        for c in range(12)
        for _ in range(22)
    ]
    before = depths(broker, queue)
    assert all(before[step] for step in range(1, 10)), before

    # The router comes off: plain workers start, and the command runs while they consume.
    worker = Worker({**env, "WORKERS_ROUTER": "off"}, "-P", "threads", "-c", "8", "-Q", queue)
    try:
        worker.wait_ready()
        report = migrate(worker_env["BROKER_URL"], queue, "--to", "plain")
        deadline = time.monotonic() + 60
        while len(runs()) < len(ids) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        worker.stop()
        publisher.close()

    assert report["moved"] == sum(before[s] for s in (1, 2, 4, 5, 7, 8))
    assert runs() == dict.fromkeys(ids, 1)
    assert sum(depths(broker, queue).values()) == 0


@pytest.fixture
def plain_app(app_module: Callable[..., str], redis_server_url: str, queue: str) -> str:
    """A module with the app the workers run once the router is off (``-A`` loads it)."""
    return app_module(broker_db_url(redis_server_url), queue, install=False)


def test_queues_and_doctor_on_a_plain_app_find_stranded_documents_and_name_the_command(
    broker: redis.Redis, queue: str, plain_app: str, redis_server_url: str
) -> None:
    broker.lpush(key(queue, 2), "a", "b")
    broker.lpush(key(queue, 3), "c")
    runner = CliRunner()

    shown = runner.invoke(main, ["queues", "-A", plain_app], terminal_width=200)
    as_json = json.loads(runner.invoke(main, ["queues", "-A", plain_app, "--json"]).output)
    doctor = json.loads(runner.invoke(main, ["doctor", "-A", plain_app, "--json"]).output)

    assert f"2 message(s) of '{queue}' wait in lists this app's workers do not poll" in shown.output
    assert f"priority-router migrate {queue} --to plain -A {plain_app}" in shown.output
    assert as_json["unpolled"] == {queue: 2} and as_json["polled_steps"] == [0, 3, 6, 9]
    (stranded,) = [f for f in doctor if f["check"] == "stranded"]
    assert not stranded["ok"] and "(2 messages)" in stranded["detail"]
    assert f"priority-router migrate {queue} --to plain" in stranded["fix"]

    migrate(broker_db_url(redis_server_url), queue, "--to", "plain")
    again = json.loads(runner.invoke(main, ["doctor", "-A", plain_app, "--json"]).output)
    assert next(f for f in again if f["check"] == "stranded")["ok"]


def test_doctor_fails_on_a_store_of_another_schema(
    app_module: Callable[..., str], redis_server_url: str, key_prefix: str, queue: str
) -> None:
    name = app_module(broker_db_url(redis_server_url), queue)
    store = redis.Redis.from_url(counter_db_url(redis_server_url))
    store.set(f"{key_prefix}schema", "7")
    try:
        findings = json.loads(CliRunner().invoke(main, ["doctor", "-A", name, "--json"]).output)
    finally:
        store.delete(f"{key_prefix}schema")
        store.close()
    (schema,) = [f for f in findings if f["check"] == "schema"]
    assert not schema["ok"] and "schema 7" in schema["detail"] and "new key_prefix" in schema["fix"]


def test_doctor_counts_as_unrouted_only_documents_no_router_priced(
    broker: redis.Redis, queue: str, plain_app: str
) -> None:
    # max_wait moves overdue routed documents into the first list too.
    promoted = {"headers": {"priority_router_reason": "counted"}, "body": ""}
    broker.lpush(queue, json.dumps(promoted), json.dumps({"headers": {}, "body": ""}), json.dumps(promoted))

    findings = json.loads(CliRunner().invoke(main, ["doctor", "-A", plain_app, "--json"]).output)

    (unrouted,) = [f for f in findings if f["check"] == "unrouted"]
    assert not unrouted["ok"] and f"(1 in '{queue}')" in unrouted["detail"]
    assert "priority_steps" in unrouted["fix"] and "priority=5 on send_task" in unrouted["fix"]
    broker.delete(queue)
    broker.lpush(queue, json.dumps(promoted))
    again = json.loads(CliRunner().invoke(main, ["doctor", "-A", plain_app, "--json"]).output)
    assert next(f for f in again if f["check"] == "unrouted")["ok"]


def test_switching_off_names_the_documents_caps_hold_in_the_store(
    broker: redis.Redis, queue: str, redis_server_url: str
) -> None:
    """Held documents wait in their holding queues, not in the queue: migrate --to plain says
    how many, whose, and what to do before the last router worker stops."""
    from priority_router import PriorityRouter

    prefix = f"held-{uuid.uuid4().hex[:8]}:"
    store = counter_db_url(redis_server_url)
    router = PriorityRouter(store, key_prefix=prefix)
    router.set_tier("bulk", max_in_flight=1)
    limits = router.limits("bulk")
    assert engine_of(router).gate_store.admit("bulk", "first", limits, 1000).outcome == "run"
    held = engine_of(router).gate_store.admit("bulk", "second", limits, 1000)
    assert held.outcome == "held"
    engine_of(router).gate_store.note_held("bulk", held)
    result = CliRunner().invoke(
        main,
        ["migrate", queue, "--to", "plain", "-b", broker_db_url(redis_server_url), "--json"],
        env={"PRIORITY_ROUTER_REDIS_URL": store, "PRIORITY_ROUTER_KEY_PREFIX": prefix},
    )
    assert result.exit_code == 0, result.output
    (note,) = [n for n in json.loads(result.stdout)["notes"] if "held by caps" in n]
    assert "1 document(s)" in note and "'bulk' (1)" in note and "tier unset" in note
    router.unset_tier("bulk")
