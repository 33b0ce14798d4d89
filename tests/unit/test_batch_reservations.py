"""``router.batch``: a client's documents counted in one round trip, taken in publish order."""

from __future__ import annotations

import logging

import fakeredis
import pytest

from priority_router import PriorityRouter, Reason


@pytest.fixture
def router(fake_redis: fakeredis.FakeRedis, key_prefix: str) -> PriorityRouter:
    return PriorityRouter(redis_client=fake_redis, key_prefix=key_prefix)


def test_publishes_in_the_block_take_the_reserved_decisions(router: PriorityRouter) -> None:
    with router.batch("acme", 5) as batch:
        assert router.peek("acme").pending == -4, "the whole batch is counted on entry"
        taken = [router.decide("acme") for _ in range(5)]
        assert batch.remaining == 0
    assert [(d.pending, d.priority, d.reason) for d in taken] == [
        (0, 1, Reason.COUNTED),
        (-1, 1, Reason.COUNTED),
        (-2, 1, Reason.COUNTED),
        (-3, 2, Reason.COUNTED),
        (-4, 2, Reason.COUNTED),
    ]
    assert router.decide("acme").pending == -5


def test_other_clients_and_extra_documents_are_counted_as_usual(router: PriorityRouter) -> None:
    with router.batch("acme", 2):
        assert router.decide("beta").pending == 0
        assert [router.decide("acme").pending for _ in range(4)] == [0, -1, -2, -3]
    assert router.peek("beta").pending == 0


def test_nested_batches_and_leaving_the_block(router: PriorityRouter) -> None:
    with router.batch("acme", 1):
        with router.batch("beta", 1):
            assert router.decide("acme").pending == -1, "only the innermost batch is current"
            assert router.decide("beta").pending == 0
        assert router.decide("acme").pending == 0
    assert router.decide("acme").pending == -2


def test_unused_reservations_are_warned_about(
    router: PriorityRouter, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="priority_router"), router.batch("acme", 3) as batch:
        router.decide("acme")
    assert batch.remaining == 2
    assert "reserved 3 documents but published 1" in caplog.text
    assert "router.batch(client, len(documents))" in caplog.text
    assert router.peek("acme").pending == -2


def test_a_batch_is_priced_by_the_process_own_count_when_the_store_is_down(key_prefix: str) -> None:
    router = PriorityRouter(redis_url="redis://127.0.0.1:1/0", key_prefix=key_prefix, default_priority=6)
    with router.batch("acme", 4):
        decisions = [router.decide("acme") for _ in range(4)]
    assert [(d.pending, d.priority, d.reason) for d in decisions] == [
        (0, 1, Reason.LOCAL),
        (-1, 1, Reason.LOCAL),
        (-2, 1, Reason.LOCAL),
        (-3, 2, Reason.LOCAL),
    ]
    assert router.decide("acme").pending == -4


def test_bad_batches_are_refused(router: PriorityRouter) -> None:
    with pytest.raises(ValueError, match="not a client id"), router.batch(None, 3):
        pass
    with pytest.raises(ValueError, match="batch size -1"), router.batch("acme", -1):
        pass
    assert router.peek("acme").pending == 0
