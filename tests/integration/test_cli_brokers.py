"""``priority-router queues`` and ``doctor`` against real brokers."""

from __future__ import annotations

import importlib
import json
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from amqp.exceptions import NotFound
from celery import Celery
from click.testing import CliRunner
from kombu import Connection, Queue
from support.services import broker_db_url, running_worker

from priority_router.ops.cli import main
from priority_router.router import engine_of

AppFactory = Callable[..., str]


def _app(name: str) -> Celery:
    return importlib.import_module(name).app  # type: ignore[no-any-return]


def invoke(*args: str) -> tuple[int, Any]:
    result = CliRunner().invoke(main, [*args, "--json"])
    try:
        return result.exit_code, json.loads(result.output)
    except json.JSONDecodeError:
        raise AssertionError(result.output) from None


def failed(findings: list[dict[str, Any]]) -> set[str]:
    return {f["check"] for f in findings if not f["ok"]}


def publish_burst(app: Celery) -> None:
    for _ in range(22):
        app.send_task("doc", headers={"client_id": "bulk"})
    app.send_task("doc", headers={"client_id": "light"})


@pytest.mark.compat
def test_queues_counts_each_priority_level(app_module: AppFactory, broker_url: str) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    routed = app_module(broker_url, queue)
    plain = app_module(broker_url, queue, install=False)
    publish_burst(_app(routed))
    _app(plain).send_task("doc")

    # AMQP publishes are not confirmed: RabbitMQ may count the last few a moment after the
    # publisher's connection returned, so read until the depth settles (at most 5 s).
    deadline = time.monotonic() + 5
    while True:
        code, data = invoke("queues", "-A", routed)
        assert code == 0
        (depth,) = data["queues"]
        if depth["ready"] == 24 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert depth["queue"] == queue
    assert depth["ready"] == 24
    if data["transport"] == "redis":
        # The worked example's 22-document burst plus one light client and one plain message.
        counts = {int(k): v for k, v in depth["by_priority"].items()}
        assert counts == {0: 1, 1: 4, 2: 2, 3: 2, 4: 2, 5: 2, 6: 2, 7: 2, 8: 6, 9: 1}
    else:
        assert depth["by_priority"] == {}
        assert depth["consumers"] == 0


@pytest.mark.compat
def test_doctor_passes_an_installed_app(app_module: AppFactory, broker_url: str) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    name = app_module(broker_url, queue)
    code, findings = invoke("doctor", "-A", name)
    assert [f for f in findings if not f["ok"]] == []
    assert code == 0
    if broker_url.startswith("amqp"):
        # The doctor looked without creating anything.
        with Connection(broker_url) as conn, pytest.raises(NotFound):
            conn.default_channel.queue_declare(queue=queue, passive=True)


def test_doctor_checks_for_the_pool_the_live_workers_run(
    app_module: AppFactory, broker_url: str, tmp_path: Path
) -> None:
    """Without -P/-c, doctor asks the workers: a threads worker is checked as one, not as the
    app's default prefork pool."""
    # A control exchange of its own: other test sessions' workers on the broker do not answer.
    name = app_module(
        broker_url, f"q-{uuid.uuid4().hex[:8]}", {"control_exchange": f"alone-{uuid.uuid4().hex[:8]}"}
    )
    _, findings = invoke("doctor", "-A", name)
    (pool,) = [f for f in findings if f["check"] == "pool"]
    assert "no worker answered" in pool["detail"]
    with running_worker({"PYTHONPATH": str(tmp_path)}, "--pool", "threads", "--concurrency", "3", app=name):
        _, findings = invoke("doctor", "-A", name)
    (pool,) = [f for f in findings if f["check"] == "pool"]
    assert pool["detail"] == "threads pool, concurrency 3, as the 1 worker(s) answering run"
    (prefetch,) = [f for f in findings if f["check"] == "prefetch"]
    assert prefetch["detail"].startswith("threads pool, concurrency 3")
    # Without a live worker, an autoscaled one is described as it is started.
    _, findings = invoke("doctor", "-A", name, "--autoscale", "4,1")
    (prefetch,) = [f for f in findings if f["check"] == "prefetch"]
    assert prefetch["detail"].startswith("prefork pool, autoscaled from 1 to 4")
    refused = CliRunner().invoke(main, ["doctor", "-A", name, "--autoscale", "four"])
    assert refused.exit_code == 2 and "give MAX,MIN" in refused.output


def test_doctor_names_what_defeats_priorities(app_module: AppFactory, redis_server_url: str) -> None:
    name = app_module(
        broker_db_url(redis_server_url),
        f"q-{uuid.uuid4().hex[:8]}",
        {
            "worker_prefetch_multiplier": 4,
            "task_acks_late": False,
            "broker_transport_options": {"priority_steps": [0, 3, 6, 9], "visibility_timeout": 60},
            "task_time_limit": 600,
        },
        install=False,
    )
    code, findings = invoke("doctor", "-A", name)
    assert code == 1
    assert failed(findings) == {
        "router",
        "prefetch",
        "acks_late",
        "priority_steps",
        "queue_order_strategy",
        "visibility_timeout",
    }
    assert all(f["fix"] for f in findings if not f["ok"])


def test_doctor_finds_messages_stranded_by_a_producer_with_another_separator(
    app_module: AppFactory, redis_server_url: str
) -> None:
    broker, queue = broker_db_url(redis_server_url), f"q-{uuid.uuid4().hex[:8]}"
    producer = app_module(broker, queue, {"broker_transport_options": {"sep": ":"}})
    worker = app_module(broker, queue)
    publish_burst(_app(producer))

    code, findings = invoke("doctor", "-A", worker)
    assert code == 1
    (stranded,) = [f for f in findings if f["check"] == "stranded"]
    assert f"'{queue}:8' (6 messages)" in stranded["detail"]
    assert f"'{queue}:9' (1 messages)" in stranded["detail"]


@pytest.mark.rabbitmq
def test_doctor_refuses_a_fifo_rabbitmq_queue(app_module: AppFactory, amqp_url: str) -> None:
    queue = f"fifo-{uuid.uuid4().hex[:8]}"
    with Connection(amqp_url) as conn:
        Queue(queue, channel=conn.default_channel).declare()
    try:
        code, findings = invoke("doctor", "-A", app_module(amqp_url, queue))
        assert code == 1
        (finding,) = [f for f in findings if not f["ok"]]
        assert finding["check"] == "x-max-priority"
        assert queue in finding["detail"] + finding["fix"]
    finally:
        with Connection(amqp_url) as conn:
            conn.default_channel.queue_delete(queue)


def test_store_options_typed_with_dash_a_win_over_the_apps_and_say_so(
    app_module: AppFactory, redis_server_url: str, key_prefix: str
) -> None:
    from support.services import counter_db_url

    from priority_router import PriorityRouter

    name = app_module(broker_db_url(redis_server_url), f"q-{uuid.uuid4().hex[:8]}")
    other = key_prefix + "other:"
    PriorityRouter(counter_db_url(redis_server_url), key_prefix=other, mode="inflight").record("acme", "t1")
    result = CliRunner().invoke(
        main, ["-A", name, "inspect", "acme", "--json", "--mode", "inflight", "--key-prefix", other]
    )
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)
    assert (row["tracked"], row["in_flight"]) == (True, 1)
    assert (
        f"--mode inflight, --key-prefix {other} given: used instead of the setting of app {name!r}"
        in result.stderr
    )
    # Without them, the app's own store, and nothing said.
    plain = CliRunner().invoke(main, ["-A", name, "inspect", "acme", "--json"])
    assert json.loads(plain.stdout)["tracked"] is False
    assert plain.stderr == ""


def test_doctor_flags_a_cap_that_can_never_bite_and_names_documents_held_past_max_wait(
    app_module: AppFactory, redis_server_url: str, key_prefix: str
) -> None:
    import time

    from support.services import counter_db_url

    from priority_router import PriorityRouter

    name = app_module(
        broker_db_url(redis_server_url),
        f"q-{uuid.uuid4().hex[:8]}",
        {"priority_router_max_wait": 2, "control_exchange": f"alone-{uuid.uuid4().hex[:8]}"},
    )
    router = PriorityRouter(counter_db_url(redis_server_url), key_prefix=key_prefix)
    router.set_tier("bulk", max_in_flight=4)
    code, findings = invoke("doctor", "-A", name, "-P", "threads", "-c", "4")
    (finding,) = [f for f in findings if f["check"] == "limits" and not f["ok"]]
    assert (
        "max_in_flight=4, is at least the whole pool (4 slot(s), one worker, threads pool"
        in finding["detail"]
    )
    assert code == 1

    router.set_tier("bulk", max_in_flight=1)
    limits = router.limits("bulk")
    long_ago = int(time.time() * 1000) - 40_000
    engine_of(router).gate_store.admit("bulk", "running", limits, 1000, now_ms=long_ago)
    verdict = engine_of(router).gate_store.admit("bulk", "waiting", limits, 1000, now_ms=long_ago)
    engine_of(router).gate_store.note_held("bulk", verdict)
    code, findings = invoke("doctor", "-A", name, "-P", "threads", "-c", "4")
    (finding,) = [f for f in findings if f["check"] == "limits" and "max_wait" in f["detail"]]
    # Held 40 s ago, and doctor's looks take their seconds on a busy machine.
    assert re.search(
        r"client 'bulk' has 1 document\(s\) held by its limits, the oldest for [4-9]\d s", finding["detail"]
    )
    assert "longer than max_wait=2 s" in finding["detail"]
    # Said, not failed: a capped client's burst outlasts max_wait in normal running.  (Here
    # the running document's lease ran out and no worker answers: both failed on lines of
    # their own.)
    assert finding["ok"]

    # The running document ended and nothing released the held one: no router worker runs.
    engine_of(router).gate_store.end("bulk", "running", limits)
    code, findings = invoke("doctor", "-A", name, "-P", "threads", "-c", "4")
    stalled = [f for f in findings if f["check"] == "limits" and "release such documents" in f["detail"]]
    assert len(stalled) == 1, findings
    assert "client 'bulk' has 1 document(s) held while 0 of its max_in_flight=1 run" in stalled[0]["detail"]
    assert code == 1

    # The limits lifted, no worker with the router running: the held document is stranded.
    router.set_tier("bulk", max_in_flight=1)
    router.unset_tier("bulk")
    code, findings = invoke("doctor", "-A", name, "-P", "threads", "-c", "4")
    (finding,) = [f for f in findings if f["check"] == "limits" and not f["ok"]]
    assert re.search(
        r"1 document\(s\) are still held although no client has limits, the oldest for [4-9]\d s",
        finding["detail"],
    )
    assert "start one worker with this release's router" in finding["fix"]
    assert code == 1


def test_doctor_says_when_clients_share_the_tables_last_row(
    app_module: AppFactory, redis_server_url: str, key_prefix: str
) -> None:
    from support.services import counter_db_url

    from priority_router import PriorityRouter

    name = app_module(broker_db_url(redis_server_url), f"q-{uuid.uuid4().hex[:8]}")
    router = PriorityRouter(redis_url=counter_db_url(redis_server_url), key_prefix=key_prefix)
    for client in ("bulk", "partner"):
        for _ in range(25):
            router.record(client)
    _, findings = invoke("doctor", "-A", name)
    (table,) = [f for f in findings if f["check"] == "threshold table"]
    assert table["ok"]  # said, not failed: a busy hour is not a broken deployment
    assert table["detail"].startswith("default: 2 clients (bulk, partner) share the table's last row")
    assert 'thresholds="wide"' in table["detail"]
    assert "`priority-router simulate TRACE --tune` fits a table to it" in table["detail"]
    # The same app with the Celery setting priority_router_thresholds = "wide".
    wide = app_module(
        broker_db_url(redis_server_url), f"q-{uuid.uuid4().hex[:8]}", {"priority_router_thresholds": "wide"}
    )
    _, findings = invoke("doctor", "-A", wide)
    (table,) = [f for f in findings if f["check"] == "threshold table"]
    assert table["ok"]
    assert table["detail"] == "wide: no two clients share its last row (pending < -1008, priority 9)"


def test_doctor_without_a_worker_or_pool_blames_the_held_documents_not_a_guessed_pool(
    app_module: AppFactory, broker_url: str, counter_url: str, key_prefix: str
) -> None:
    """No worker answers and no -P/-c: the cap is not measured against the app's default
    pool (2 slots here would have failed it); the documents held with no worker are the problem."""
    from priority_router import PriorityRouter

    # Its own control exchange: no worker of another test session answers its broadcasts.
    alone = {"worker_concurrency": 2, "control_exchange": f"alone-{uuid.uuid4().hex[:8]}"}
    name = app_module(broker_url, f"q-{uuid.uuid4().hex[:8]}", alone)
    router = PriorityRouter(counter_url, key_prefix=key_prefix)
    router.set_tier("bulk", max_in_flight=2)
    limits = router.limits("bulk")
    for task in ("r1", "r2", "h1", "h2"):
        verdict = engine_of(router).gate_store.admit("bulk", task, limits, 1000)
    assert verdict.outcome == "held"
    engine_of(router).gate_store.note_held("bulk", verdict)

    code, findings = invoke("doctor", "-A", name)
    assert failed(findings) == {"held"}, findings
    assert code == 1
    (held,) = [f for f in findings if f["check"] == "held"]
    assert held["detail"].startswith("2 document(s) are held by caps and no worker answered")
    assert "start the workers" in held["fix"]
    (limits_row,) = [f for f in findings if f["check"] == "limits"]
    assert "the caps could not be checked against the pool: no worker answered" in limits_row["detail"]

    # Given the pool the workers run, the cap is measured against it.
    code, findings = invoke("doctor", "-A", name, "-P", "prefork", "-c", "2")
    assert failed(findings) == {"held", "limits"}, findings
    assert code == 1


@pytest.mark.rabbitmq
@pytest.mark.parametrize("users", [120, None])
def test_doctor_fails_amqp_heartbeats_kept_on_a_green_pool(
    app_module: AppFactory, amqp_url: str, tmp_path: Path, users: int | None
) -> None:
    """broker_heartbeat=120 set by the user on a gevent worker on RabbitMQ: about 10 documents
    a second whatever -c is.  doctor fails it for -P gevent and for a live gevent worker, and
    the worker's ready line shows it (the router's 0 when the user sets none)."""
    settings: dict[str, Any] = {"control_exchange": f"alone-{uuid.uuid4().hex[:8]}"}
    if users is not None:
        settings["broker_heartbeat"] = users
    name = app_module(amqp_url, f"q-{uuid.uuid4().hex[:8]}", settings)
    problems = {"heartbeat"} if users else set()
    code, findings = invoke("doctor", "-A", name, "-P", "gevent", "-c", "20")
    assert failed(findings) == problems, findings
    assert code == (1 if problems else 0)
    (heartbeat,) = [f for f in findings if f["check"] == "heartbeat"]
    if users:
        assert heartbeat["detail"].startswith("gevent pool, concurrency 20: broker_heartbeat=120: ")
        assert "10 documents a second" in heartbeat["detail"]
        assert "set broker_heartbeat = 0" in heartbeat["fix"]
    else:
        assert "install() sets broker_heartbeat=0 (now 120" in heartbeat["detail"]

    env = {"PYTHONPATH": str(tmp_path)}
    with running_worker(env, "--pool", "gevent", "--concurrency", "20", app=name) as worker:
        # doctor asks the live workers for 1 s: a gevent worker just started may answer later.
        for _ in range(5):
            code, findings = invoke("doctor", "-A", name)
            (pool,) = [f for f in findings if f["check"] == "pool"]
            if "answering" in pool["detail"]:
                break
        log = worker.output()
    assert pool["detail"] == "gevent pool, concurrency 20, as the 1 worker(s) answering run"
    assert failed(findings) == problems, findings
    assert code == (1 if problems else 0)
    (ready,) = [line for line in log.splitlines() if "priority-router on " in line]
    shown = f"broker_heartbeat={users if users else 0}"
    assert ready.endswith(f"worker_prefetch_multiplier=1, task_acks_late=True, {shown}"), ready


@pytest.mark.rabbitmq
def test_migrate_names_the_way_out_of_a_quorum_queue(app_module: AppFactory, amqp_url: str) -> None:
    """``migrate`` cannot change a queue's type: before RabbitMQ 4.0, "leave it as it is"
    would leave it without priorities for good, so the fix names the way to a classic queue."""
    queue = f"quorum-{uuid.uuid4().hex[:8]}"
    app = app_module(amqp_url, queue, settings={"task_default_queue_type": "quorum"})
    result = CliRunner().invoke(main, ["migrate", queue, "--to", "router", "-A", app, "--dry-run"])
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "it is a quorum queue" in said
    fix = "before 4.0, move its documents to a classic queue under a new name, or drain and delete it"
    assert fix in said


@pytest.mark.rabbitmq
def test_doctor_never_suggests_the_global_priority_setting_beside_quorum_queues(
    app_module: AppFactory, amqp_url: str
) -> None:
    """``task_queue_max_priority`` would add x-max-priority to the quorum queues too, and
    RabbitMQ refuses their publishes then (the newcomer's trial followed that fix)."""
    queue = f"classic-{uuid.uuid4().hex[:8]}"
    app = app_module(amqp_url, queue, settings={"task_create_missing_queue_type": "quorum"})
    _, findings = invoke("doctor", "-A", app)
    fixes = [f["fix"] for f in findings if f["check"] == "x-max-priority" and not f["ok"]]
    assert not any("task_queue_max_priority" in fix for fix in fixes), fixes
    # The default queue, created by name, is one the router declares with x-max-priority
    # (as a publish would): doctor used to report it bare before any publish.
    assert [f["ok"] for f in findings if f["check"] == "x-max-priority"] == [True], findings


def test_doctor_names_settings_the_router_is_given_but_cannot_act_on(
    app_module: AppFactory, amqp_url: str, redis_server_url: str, tmp_path: Path
) -> None:
    """Found in a field trial, each said nowhere: the environment variable's name in a
    configuration module (Celery reads lower case), a tasks pattern one letter off the task,
    and max_wait on RabbitMQ (the workers refuse to start; doctor said no problems)."""
    queue = f"q-{uuid.uuid4().hex[:8]}"
    name = app_module(
        broker_db_url(redis_server_url),
        queue,
        {"PRIORITY_ROUTER_MODE": "inflight", "priority_router_tasks": "ingest.proces_document"},
        tasks="ingest.process_document",
    )
    code, findings = invoke("doctor", "-A", name)
    assert code == 1
    by_check = {f["check"]: f for f in findings if not f["ok"]}
    assert set(by_check) == {"setting names", "tasks"}, findings
    assert "PRIORITY_ROUTER_MODE (did you mean priority_router_mode?)" in by_check["setting names"]["detail"]
    assert "ingest.process_document ('ingest.proces_document' matches no task" in by_check["tasks"]["detail"]
    with running_worker({"PYTHONPATH": str(tmp_path)}, "--pool", "solo", app=name) as worker:
        deadline = time.monotonic() + 30
        while "counts no document of task" not in worker.output() and time.monotonic() < deadline:
            time.sleep(0.2)
        log = worker.output()
    assert (
        "counts no document of task ingest.process_document: the tasks setting's 'ingest.proces_document'"
        in log
    )

    code, findings = invoke("doctor", "-A", app_module(amqp_url, queue, {"priority_router_max_wait": 60}))
    assert code == 1
    (router,) = [f for f in findings if f["check"] == "router"]
    assert not router["ok"] and "workers refuse to start" in router["detail"]
    assert "use a Redis broker" in router["fix"]
