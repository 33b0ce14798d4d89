"""mode="inflight": its settings, keys and refusals (docs/scheme.md, "Inflight mode");
the store's contract is tests/contract/test_inflight_list.py."""

from __future__ import annotations

import fakeredis
import pytest

from priority_router import PriorityRouter
from priority_router.config import RouterConfig
from priority_router.errors import ConfigurationError
from priority_router.router import engine_of
from priority_router.store.client_ids import client_id_from_inflight_key, client_key, inflight_key


@pytest.fixture
def router() -> PriorityRouter:
    return PriorityRouter(mode="inflight", redis_client=fakeredis.FakeRedis())


def test_keys_do_not_collide_with_the_seed_counter() -> None:
    fake = fakeredis.FakeRedis()
    seed = PriorityRouter(redis_client=fake)
    inflight = PriorityRouter(mode="inflight", redis_client=fake)
    assert seed.record("acme").pending == 0
    assert inflight.record("acme", "t1").pending == 0
    assert seed.record("acme").pending == -1
    assert inflight.record("acme", "t2").pending == -1
    assert [s.client_id for s in engine_of(seed).store.scan()] == ["acme"]
    assert [(s.client_id, s.pending) for s in engine_of(inflight).store.scan()] == [("acme", -1)]
    assert engine_of(inflight).store.clear_all() == 2, "its list and its order key"
    assert seed.peek("acme").pending == -1
    key = inflight_key("priority-router:", "a{b}:i")
    assert key != client_key("priority-router:", "a{b}:i")
    assert client_id_from_inflight_key("priority-router:", key) == "a{b}:i"


def test_ttl_is_the_idle_reset_rearmed_by_ends(router: PriorityRouter) -> None:
    router.record("acme", "a")
    router.record("acme", "b")
    # 10 s, far under the idle reset: 10 ms ran out before the end on a loaded machine.
    engine_of(router).redis.pexpire(engine_of(router).store.key("acme"), 10_000)
    router.end("acme", "a")
    assert router.state("acme").ttl_ms > 1_000_000


def test_batch_and_record_many_refuse_in_inflight_mode(router: PriorityRouter) -> None:
    with pytest.raises(ConfigurationError, match="inflight"):
        router.record_many("acme", 3)
    with pytest.raises(ConfigurationError, match="inflight"), router.batch("acme", 3):
        pass
    with pytest.raises(ValueError, match="task id"):
        router.record("acme")
    with pytest.raises(ConfigurationError):
        PriorityRouter(redis_client=fakeredis.FakeRedis()).end("acme", "t")


def test_mode_setting() -> None:
    assert RouterConfig().mode == "seed"
    assert RouterConfig.from_env({"PRIORITY_ROUTER_MODE": "inflight"}).mode == "inflight"
    with pytest.raises(ConfigurationError, match="seed, inflight"):
        RouterConfig(mode="pending")


def test_decide_without_a_task_id_is_not_counted(router: PriorityRouter) -> None:
    decision = router.decide("acme")
    assert decision.pending is None and router.peek("acme").pending == 0
