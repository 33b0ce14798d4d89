"""Per-client caps and rates with real publishes and real workers, on both brokers
(integration/gate.py, store/gate.py; docs/caps.md).

``make test`` runs every test on Redis and the cap and the kill on RabbitMQ too;
``make kill-matrix`` runs the rest on RabbitMQ."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from support.services import Worker, broker_db_url, close_app, fast_redelivery, running_worker
from support.simulation import most_at_once

from priority_router import PriorityRouter
from priority_router.store.client_ids import gate_keys
from workers.app import create_app

TRACK = "tests.track_running"
BOTH_BROKERS = pytest.mark.parametrize(
    "broker_url", ["redis", pytest.param("amqp", marks=pytest.mark.rabbitmq)], indirect=True
)


@pytest.fixture(params=["redis", pytest.param("amqp", marks=[pytest.mark.rabbitmq, pytest.mark.matrix])])
def broker_url(request: pytest.FixtureRequest, redis_server_url: str) -> str:
    if request.param == "redis":
        return broker_db_url(redis_server_url)
    return str(request.getfixturevalue("amqp_url"))


@pytest.fixture
def runs(worker_env: dict[str, str]) -> Iterator[tuple[dict[str, str], redis.Redis]]:
    """The worker environment with a short lease, and a hash where ``tests.track_running``
    counts runs and the most running at once."""
    key = f"runs-{uuid.uuid4().hex[:8]}"
    env = {
        **worker_env,
        "RUNS_REDIS_URL": worker_env["PRIORITY_ROUTER_REDIS_URL"],
        "RUNS_KEY": key,
        "PRIORITY_ROUTER_LEASE": "3",
    }
    client = redis.Redis.from_url(env["RUNS_REDIS_URL"])
    yield env, client
    client.delete(key)
    client.close()


def _router(env: dict[str, str]) -> PriorityRouter:
    return PriorityRouter.from_env(env, socket_timeout=5, connect_timeout=5)


def _trial(
    runs: tuple[dict[str, str], redis.Redis], producer: Callable[[], Celery], client: str, **limits: Any
) -> tuple[dict[str, str], redis.Redis, PriorityRouter, Celery]:
    """The environment, the runs hash, a router that gave ``client`` these limits, a producer."""
    env, seen = runs
    router = _router(env)
    router.set_tier(client, **limits)
    return env, seen, router, producer()


def _send(app: Celery, client: str, seconds: float, n: int) -> list[Any]:
    return [app.send_task(TRACK, kwargs={"seconds": seconds, "client_id": client}) for _ in range(n)]


def _most_at_once(results: list[dict[str, Any]]) -> int:
    """The most documents whose runs overlapped, from the runs that finished."""
    return most_at_once((r["started"], r["ended"]) for r in results)


def _runs_of(seen: redis.Redis, env: dict[str, str], results: list[Any]) -> list[int]:
    return [int(seen.hget(env["RUNS_KEY"], f"run:{r.id}") or 0) for r in results]


def _wait_held(router: PriorityRouter, client: str, n: int, log: Callable[[], str] = str) -> None:
    deadline = time.monotonic() + 30
    while router.gate_state(client).held < n:
        assert time.monotonic() < deadline, f"fewer than {n} documents were held: {log()}"
        time.sleep(0.05)


def _settled(router: PriorityRouter, client: str, timeout: float = 15) -> tuple[int, int]:
    """The client's running and held counts once nothing of it runs or waits (or the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        state = router.gate_state(client)
        if (state.running, state.held) == (0, 0) or time.monotonic() > deadline:
            return state.running, state.held
        time.sleep(0.1)


@BOTH_BROKERS
def test_a_capped_client_never_runs_more_than_its_cap_and_others_are_not_held(
    producer: Callable[[], Celery], runs: tuple[dict[str, str], redis.Redis]
) -> None:
    env, seen, router, app = _trial(runs, producer, "bulk", max_in_flight=2)
    bulk = _send(app, "bulk", 0.3, 10)
    light = _send(app, "light", 0.05, 3)
    with running_worker(env, "--pool", "threads", "--concurrency", "4"):
        done = [r.get(timeout=60) for r in bulk + light]
    assert int(seen.hget(env["RUNS_KEY"], "max:bulk") or 0) == 2
    assert int(seen.hget(env["RUNS_KEY"], "max:light") or 0) >= 2  # uncapped: in parallel
    assert _runs_of(seen, env, bulk + light) == [1] * 13
    # Light documents did not wait for bulk's backlog: they ended before bulk's last started.
    assert max(r["ended"] for r in done[10:]) < max(r["started"] for r in done[:10])
    assert _settled(router, "bulk") == (0, 0)


def test_a_cap_holds_across_worker_processes_and_hosts(
    producer: Callable[[], Celery], runs: tuple[dict[str, str], redis.Redis]
) -> None:
    env, seen = runs
    _router(env).set_tier("bulk", max_in_flight=3)
    app = producer()
    # Sent once both workers are up: sent before, the first worker's 2 slots ran most of
    # them while a loaded machine started the second, and the cap was never reached.
    with (
        running_worker(env, "--pool", "prefork", "--concurrency", "2"),
        running_worker(env, "--pool", "threads", "--concurrency", "3"),
    ):
        bulk = _send(app, "bulk", 0.4, 12)
        for r in bulk:
            r.get(timeout=90)
    assert int(seen.hget(env["RUNS_KEY"], "max:bulk") or 0) == 3
    assert _runs_of(seen, env, bulk) == [1] * 12


def test_a_cap_holds_while_a_prefork_pool_recycles_its_processes(
    producer: Callable[[], Celery], runs: tuple[dict[str, str], redis.Redis]
) -> None:
    """``--max-tasks-per-child=1`` forks a process per document while the worker's gate
    thread reads limits and holding queues: a process forked while it held a lock waited on
    it for good, and the client's cap with it (a field trial stalled within 15-90 documents;
    the race itself is forced in tests/unit/test_forks.py)."""
    env, seen = runs
    _router(env).set_tier("bulk", max_in_flight=1)
    app = producer()
    bulk = _send(app, "bulk", 0.02, 24)
    with running_worker(env, "--pool", "prefork", "--concurrency", "2", "--max-tasks-per-child", "1"):
        for r in bulk:
            r.get(timeout=120)
    assert int(seen.hget(env["RUNS_KEY"], "max:bulk") or 0) == 1
    assert _runs_of(seen, env, bulk) == [1] * 24


def test_lifting_a_cap_starts_the_held_documents_within_seconds(
    producer: Callable[[], Celery], runs: tuple[dict[str, str], redis.Redis]
) -> None:
    env, seen, router, app = _trial(runs, producer, "bulk", max_in_flight=1)
    bulk = _send(app, "bulk", 6, 1) + _send(app, "bulk", 0.1, 4)
    with running_worker(env, "--pool", "threads", "--concurrency", "4"):
        _wait_held(router, "bulk", 4)
        lifted = time.monotonic()
        router.unset_tier("bulk")
        for r in bulk[1:]:
            r.get(timeout=30)
        assert time.monotonic() - lifted < 5
        assert not bulk[0].ready()  # they did not wait for the running one to end
        # Released with their slots reserved, they gave them back as they ended, the cap
        # lifted or not: only the long one holds a slot (within the 3 s lease: not by lapsing).
        deadline = time.monotonic() + 1
        while router.gate_state("bulk").running > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert router.gate_state("bulk").running == 1
        bulk[0].get(timeout=30)
    assert _runs_of(seen, env, bulk) == [1] * 5


def test_no_sent_mark_outlives_documents_released_when_their_cap_is_lifted(
    producer: Callable[[], Celery], runs: tuple[dict[str, str], redis.Redis]
) -> None:
    """Released after their cap was lifted, documents arrive at workers that no longer admit
    them through the store: a soak found their marks (``:sent``) an hour after they ended.
    Their ends take the marks now."""
    env, seen, router, app = _trial(runs, producer, "bulk", max_in_flight=1)
    bulk = _send(app, "bulk", 2, 1) + _send(app, "bulk", 0.1, 4)
    _, _, gate, sent = gate_keys(env["PRIORITY_ROUTER_KEY_PREFIX"], "bulk")
    with running_worker(env, "--pool", "threads", "--concurrency", "4"):
        _wait_held(router, "bulk", 4)
        router.unset_tier("bulk")
        for r in bulk:
            r.get(timeout=30)
        assert _settled(router, "bulk") == (0, 0)
        deadline = time.monotonic() + 10
        while seen.exists(sent) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert seen.zrange(sent, 0, -1) == []
    assert [f for f in seen.hkeys(gate) if f.startswith((b"r:", b"w:"))] == []
    assert _runs_of(seen, env, bulk) == [1] * 5


def test_a_worker_that_stops_with_documents_held_says_so(
    producer: Callable[[], Celery], runs: tuple[dict[str, str], redis.Redis]
) -> None:
    """Held documents wait in their holding queues for a router worker: one stopping says how many,
    whose, and what to do if it was the last; the next one releases them."""
    env, seen, router, app = _trial(runs, producer, "bulk", max_in_flight=1)
    bulk = _send(app, "bulk", 1, 1) + _send(app, "bulk", 0.05, 3)
    worker = Worker(env, "--pool", "threads", "--concurrency", "2")
    try:
        worker.wait_ready()
        _wait_held(router, "bulk", 3, worker.output)
        worker.process.send_signal(signal.SIGTERM)  # a warm shutdown: the running one ends
        worker.process.wait(timeout=30)
        out = worker.output()
    finally:
        worker.stop()
    assert "held by caps, of 'bulk' (" in out and "tier unset" in out
    with running_worker(env, "--pool", "threads", "--concurrency", "2"):
        for r in bulk:
            r.get(timeout=30)
    assert _runs_of(seen, env, bulk) == [1] * 4


def test_a_rate_starts_its_burst_then_r_per_second(
    producer: Callable[[], Celery], runs: tuple[dict[str, str], redis.Redis]
) -> None:
    env, _, _, app = _trial(runs, producer, "api", rate="5/s")
    docs = _send(app, "api", 0, 25)
    with running_worker(env, "--pool", "threads", "--concurrency", "4"):
        done = [r.get(timeout=60) for r in docs]
    starts = sorted(r["started"] for r in done)
    first = starts[0]
    # 5 at once (the burst), then 5 a second: the 25th near 4 s after the first.  A token
    # bucket lets at most burst + rate x w start in any window of w seconds, wherever the
    # first start fell behind the first token (a busy machine): 5 + 5 x 0.5, and one at the
    # window's edge.
    assert max(sum(1 for t in starts if s <= t < s + 0.5) for s in starts) <= 8
    assert 3.3 < starts[-1] - first < 5.5
    for i, s in enumerate(starts[5:], start=5):
        assert s - first >= (i - 5) / 5 - 0.05, f"document {i} started early: {s - first:.2f} s"


def test_a_rate_limits_starts_when_its_released_documents_wait_behind_others(
    producer: Callable[[], Celery], runs: tuple[dict[str, str], redis.Redis]
) -> None:
    # Released documents go back to the queue behind others of their priority; released at
    # the rate but started together once those had gone, 31 of a 5/s client started within
    # one second (#42).  A release reserves its token and the start spends it, so at most
    # the bucket's burst and the rate's tokens start in any second: 5 + 5.
    env, _, _, app = _trial(runs, producer, "api", rate="5/s")
    rated = [app.send_task(TRACK, kwargs={"seconds": 0, "client_id": "api"}, priority=5) for _ in range(60)]
    others = [
        app.send_task(TRACK, kwargs={"seconds": 0.03, "client_id": "other"}, priority=5) for _ in range(400)
    ]
    with running_worker(env, "--pool", "threads", "--concurrency", "4"):
        done = [r.get(timeout=120) for r in rated]
        for r in others:
            r.get(timeout=120)
    starts = sorted(r["started"] for r in done)
    most = max(sum(1 for t in starts if s <= t < s + 1) for s in starts)
    assert most <= 10, f"{most} documents of a 5/s client started within one second"
    assert starts[-1] - starts[0] >= (60 - 10) / 5 - 0.5


def test_borrowing_lends_the_processes_an_autoscaled_pool_has_now(
    producer: Callable[[], Celery], runs: tuple[dict[str, str], redis.Redis]
) -> None:
    """``--autoscale=4,1``: another client's burst grows the pool to 4; while it stays that
    size, a borrowing client capped at 1 alone runs on all of it (it borrowed only the
    processes the pool started with before)."""
    env, seen, _, app = _trial(runs, producer, "bulk", max_in_flight=1, borrow=True)
    with running_worker(env, "--pool", "prefork", "--autoscale", "4,1") as worker:
        burst = _send(app, "other", 1.5, 8)
        for r in burst:
            r.get(timeout=60)
        assert int(seen.hget(env["RUNS_KEY"], "max:other") or 0) >= 3, worker.output()[-3000:]
        bulk = _send(app, "bulk", 1.0, 8)  # the pool keeps its processes 30 s before shrinking
        for r in bulk:
            r.get(timeout=60)
    assert int(seen.hget(env["RUNS_KEY"], "max:bulk") or 0) >= 3
    assert _runs_of(seen, env, burst + bulk) == [1] * 16


def test_a_borrowing_client_alone_uses_the_whole_pool_and_stops_when_another_waits(
    producer: Callable[[], Celery], runs: tuple[dict[str, str], redis.Redis]
) -> None:
    env, seen, router, app = _trial(runs, producer, "bulk", max_in_flight=1, borrow=True)
    bulk = _send(app, "bulk", 0.5, 16)
    with running_worker(env, "--pool", "threads", "--concurrency", "4"):
        done = [r.get(timeout=60) for r in bulk]
        assert int(seen.hget(env["RUNS_KEY"], "max:bulk") or 0) >= 3  # it borrowed idle slots
        # Now another client's backlog waits in the queue (at priority 9, behind bulk's):
        # bulk starts nothing beyond its cap while it does.
        router.set_tier("light", fixed=9)
        light = _send(app, "light", 0.3, 30)
        bulk2 = _send(app, "bulk", 0.5, 6)
        later = [r.get(timeout=60) for r in light + bulk2]
    last_light_start = max(r["started"] for r in later[:30])
    while_others_waited = [r for r in later[30:] if r["started"] < last_light_start - 0.3]
    assert while_others_waited, "bulk ran only after the light backlog: the test shows nothing"
    assert _most_at_once(while_others_waited) == 1
    assert _runs_of(seen, env, bulk + light + bulk2) == [1] * 52
    assert len(done) == 16


@BOTH_BROKERS
def test_a_killed_worker_leaves_every_held_and_running_document_run_and_its_slots_come_back(
    producer: Callable[[], Celery], runs: tuple[dict[str, str], redis.Redis]
) -> None:
    env, seen = runs
    if env["BROKER_URL"].startswith("redis"):
        env = {**env, "BROKER_TRANSPORT_OPTIONS": fast_redelivery(env)}  # a dead worker's: after 3 s
    router = _router(env)
    router.set_tier("bulk", max_in_flight=2)
    app = producer()
    bulk = _send(app, "bulk", 1.0, 8)
    worker = Worker(env, "--pool", "threads", "--concurrency", "4")
    try:
        worker.wait_ready()
        _wait_held(router, "bulk", 6, worker.output)  # 2 running, 6 held
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait()
    finally:
        worker.stop()
    state = router.gate_state("bulk")
    assert (state.running, state.held) == (2, 6)  # the dead worker's slots are still leased
    with running_worker(env, "--pool", "threads", "--concurrency", "4"):
        done = [r.get(timeout=90) for r in bulk]
    runs_ = _runs_of(seen, env, bulk)
    assert all(n >= 1 for n in runs_)
    assert sum(runs_) <= 8 + 2  # only the two that were running may run twice
    assert _most_at_once(done) <= 2
    assert _settled(router, "bulk") == (0, 0)


def test_inspect_and_status_show_running_and_held(
    producer: Callable[[], Celery], runs: tuple[dict[str, str], redis.Redis], cli: Callable[..., Any]
) -> None:
    env, _, router, app = _trial(runs, producer, "bulk", max_in_flight=1)
    bulk = _send(app, "bulk", 3, 1) + _send(app, "bulk", 0, 3)
    with running_worker(env, "--pool", "threads", "--concurrency", "2"):
        _wait_held(router, "bulk", 3)
        inspected = json.loads(cli("inspect", "bulk", "--json").output)
        for r in bulk:
            r.get(timeout=30)
    assert inspected["gate"] == {
        "running": 1,
        "held": 3,
        "held_by": "cap",
        "limits": "max_in_flight=1",
    }


def test_a_cap_combines_with_a_weight_in_the_inflight_mode_and_every_count_returns_to_zero(
    producer: Callable[[], Celery], runs: tuple[dict[str, str], redis.Redis]
) -> None:
    env, seen = runs
    env = {**env, "PRIORITY_ROUTER_MODE": "inflight"}
    router = _router(env)
    router.set_tier("bulk", weight=2, max_in_flight=2)
    app = producer()
    app.conf.priority_router_mode = "inflight"
    bulk = _send(app, "bulk", 0.2, 8)
    assert router.state("bulk").counted == 8
    with running_worker(env, "--pool", "prefork", "--concurrency", "3"):
        done = [r.get(timeout=60) for r in bulk]
        deadline = time.monotonic() + 15
        while router.state("bulk").counted and time.monotonic() < deadline:
            time.sleep(0.1)
    assert int(seen.hget(env["RUNS_KEY"], "max:bulk") or 0) == 2
    assert _most_at_once(done) <= 2
    assert router.state("bulk").counted == 0  # every held, released and run document was ended
    assert _settled(router, "bulk") == (0, 0)


def test_a_held_document_revoked_gives_its_slot_back_when_released(
    producer: Callable[[], Celery], runs: tuple[dict[str, str], redis.Redis]
) -> None:
    env, seen, router, app = _trial(runs, producer, "bulk", max_in_flight=1)
    first = _send(app, "bulk", 2, 1)[0]
    revoked, last = _send(app, "bulk", 0, 2)
    with running_worker(env, "--pool", "threads", "--concurrency", "2"):
        _wait_held(router, "bulk", 2)
        app.control.revoke(revoked.id)
        ran = first.get(timeout=30)
        after = last.get(timeout=30)
    # The revoked document was released, found revoked, and its place freed at once: the
    # next one did not wait for its lease (3 s) to run out.
    assert after["started"] - ran["ended"] < 1.5
    assert int(seen.hget(env["RUNS_KEY"], f"run:{revoked.id}") or 0) == 0
    assert _settled(router, "bulk") == (0, 0)


@BOTH_BROKERS
def test_a_cap_holds_for_a_publisher_without_the_router_that_names_the_client_only_in_kwargs(
    runs: tuple[dict[str, str], redis.Redis],
) -> None:
    """A publisher in another language (celery-node sends no headers) names the client only
    in the task's keyword arguments: the workers' gate still finds it, as publishing does."""
    env, seen = runs
    _router(env).set_tier("bulk", max_in_flight=1)
    plain = create_app({**env, "WORKERS_ROUTER": "off"})
    plain.conf.task_queue_max_priority = 10  # declares the router's queue as the router does
    try:
        bulk = _send(plain, "bulk", 0.3, 5)
        with running_worker(env, "--pool", "threads", "--concurrency", "3"):
            for r in bulk:
                r.get(timeout=60)
    finally:
        close_app(plain)
    assert int(seen.hget(env["RUNS_KEY"], "max:bulk") or 0) == 1
    assert _runs_of(seen, env, bulk) == [1] * 5
    assert _settled(_router(env), "bulk") == (0, 0)


@BOTH_BROKERS
def test_held_documents_free_their_prefetch_slot_at_once(
    producer: Callable[[], Celery], runs: tuple[dict[str, str], redis.Redis]
) -> None:
    """With one slot left free by the cap, another client's document starts while the capped
    client's long document runs: the held ones do not keep the worker's prefetch window."""
    env, _, router, app = _trial(runs, producer, "bulk", max_in_flight=1)
    long = _send(app, "bulk", 4, 1)[0]
    _send(app, "bulk", 0, 3)
    # Without the worker's heartbeats, nothing but a task's end wakes its event loop.
    with running_worker(env, "--pool", "threads", "--concurrency", "2", "--without-heartbeat"):
        _wait_held(router, "bulk", 3)
        light = _send(app, "light", 0, 1)[0].get(timeout=30)
        ran = long.get(timeout=30)
    assert light["started"] < ran["ended"] - 1


def test_a_cost_cap_counts_each_documents_cost(
    producer: Callable[[], Celery], runs: tuple[dict[str, str], redis.Redis]
) -> None:
    from priority_router import headers as H

    env, seen, router, app = _trial(runs, producer, "scans", max_cost_in_flight=5)
    docs = [
        app.send_task(TRACK, kwargs={"seconds": 0.3, "client_id": "scans"}, headers={H.COST: 2})
        for _ in range(6)
    ]
    with running_worker(env, "--pool", "threads", "--concurrency", "4"):
        done = [d.get(timeout=60) for d in docs]
    assert int(seen.hget(env["RUNS_KEY"], "max:scans") or 0) == 2  # 2 + 2 fit in 5, a third not
    assert _most_at_once(done) == 2
    assert router.gate_state("scans").running_units == 0
