"""Per-client caps and rates with real publishes and real workers, on both brokers."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from celery import Celery
from support.services import running_worker

from priority_router import PriorityRouter

TRACK = "tests.track_running"


@pytest.fixture
def runs(worker_env: dict[str, str], redis_server_url: str) -> Iterator[tuple[dict[str, str], redis.Redis]]:
    key = f"runs-{uuid.uuid4().hex[:8]}"
    env = {**worker_env, "RUNS_REDIS_URL": worker_env["PRIORITY_ROUTER_REDIS_URL"], "RUNS_KEY": key}
    client = redis.Redis.from_url(env["RUNS_REDIS_URL"])
    yield env, client
    client.delete(key)
    client.close()


def _router(env: dict[str, str]) -> PriorityRouter:
    return PriorityRouter.from_env(env, socket_timeout=5, connect_timeout=5)


def test_a_capped_client_never_runs_more_than_its_cap_and_every_document_runs_once(
    producer: Callable[[], Celery], runs: tuple[dict[str, str], redis.Redis]
) -> None:
    env, seen = runs
    router = _router(env)
    router.set_tier("bulk", max_in_flight=2)
    app = producer()
    results = [app.send_task(TRACK, kwargs={"seconds": 0.3, "client_id": "bulk"}) for _ in range(10)]
    light = [app.send_task(TRACK, kwargs={"seconds": 0.05, "client_id": "light"}) for _ in range(3)]
    with running_worker(env, "--pool", "threads", "--concurrency", "4"):
        done = [r.get(timeout=60) for r in results + light]
    key = env["RUNS_KEY"]
    assert int(seen.hget(key, "max:bulk") or 0) == 2
    assert all(int(seen.hget(key, f"run:{r.id}") or 0) == 1 for r in results + light)
    assert len(done) == 13
    state = router.gate_state("bulk")
    assert (state.running, state.held) == (0, 0)
