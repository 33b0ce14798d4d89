"""Per-client tiers, run on fakeredis and on a real Redis (tiers.py, store/tier_store.py)."""

from __future__ import annotations

import logging
import math

import pytest
import redis
from support.redis_wire import record_sends

from priority_router import DEFAULT_THRESHOLDS, PriorityRouter
from priority_router.errors import ConfigurationError
from priority_router.limits import Limits
from priority_router.router import engine_of
from priority_router.tiers import Tier, decode

#: The worked example's priorities for documents 1..23 of one client (docs/scheme.md).
TABLE = [1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 8, 8, 8, 8, 9, 9]


@pytest.fixture(params=["fakeredis", pytest.param("redis", marks=pytest.mark.integration)])
def client(request: pytest.FixtureRequest) -> redis.Redis:
    return request.getfixturevalue("fake_redis" if request.param == "fakeredis" else "real_redis")


def make(client: redis.Redis, prefix: str, **settings: object) -> PriorityRouter:
    return PriorityRouter(redis_client=client, key_prefix=prefix, **settings)


@pytest.mark.parametrize(
    ("values", "setting"),
    [
        ({"weight": 0}, "tier weight"),
        ({"weight": -2}, "tier weight"),
        ({"weight": math.nan}, "tier weight"),
        ({"weight": True}, "tier weight"),
        ({"weight": 5000}, "tier weight"),
        ({"shift": 9}, "tier shift"),
        ({"shift": 1.5}, "tier shift"),
        ({"fixed": 0}, "tier fixed"),
        ({"fixed": 10}, "tier fixed"),
        ({"fixed": 1, "weight": 2}, "tier"),
        ({"fixed": 9, "shift": -1}, "tier"),
    ],
)
def test_bad_tiers_are_configuration_errors_and_store_nothing(
    client: redis.Redis, key_prefix: str, values: dict[str, float], setting: str
) -> None:
    router = make(client, key_prefix)
    with pytest.raises(ConfigurationError) as raised:
        router.set_tier("acme", **values)  # type: ignore[arg-type]
    assert raised.value.setting == setting and "Fix:" in str(raised.value)
    with pytest.raises(ConfigurationError):
        router.set_default_tier(**values)  # type: ignore[arg-type]
    assert router.tier("acme") is None and router.default_tier() is None


def test_weight_2_drops_a_level_half_as_fast(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    assert router.set_tier("big", weight=2) == Tier(weight=2)
    got = [router.record("big") for _ in range(46)]
    assert [d.priority for d in got] == [TABLE[int(n / 2)] for n in range(46)]
    assert {d.tier for d in got} == {"client: weight=2"}
    assert got[-1].pending == -45, "the count itself is unchanged"


def test_shift_moves_the_level_within_1_to_9(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    router.set_tier("paid", shift=-1)
    router.set_tier("slow", shift=2)
    assert [router.record("paid").priority for _ in range(23)] == [max(1, p - 1) for p in TABLE]
    assert [router.record("slow").priority for _ in range(23)] == [min(9, p + 2) for p in TABLE]


def test_fixed_gives_every_document_one_priority(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    router.set_tier("internal", fixed=1)
    router.set_tier("abusive", fixed=9)
    assert {router.record("internal").priority for _ in range(30)} == {1}
    assert {router.record("abusive").priority for _ in range(3)} == {9}
    assert router.record("internal").tier == "client: fixed=1"


def test_unset_returns_to_the_table(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    router.set_tier("acme", fixed=9)
    assert router.record("acme").priority == 9
    assert router.unset_tier("acme") is True and router.unset_tier("acme") is False
    decision = router.record("acme")
    assert (decision.priority, decision.tier) == (1, None)


def test_default_tier_applies_to_clients_without_their_own(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    router.set_default_tier(shift=1)
    router.set_tier("exempt")  # a neutral tier of its own: the default does not apply
    router.set_tier("paid", shift=-1)
    assert router.record("anyone").priority == 2 and router.record("anyone").tier == "default: shift=1"
    assert router.record("exempt").priority == 1 and router.record("exempt").tier == "client: neutral"
    assert router.record("paid").priority == 1
    assert router.default_tier() == Tier(shift=1)
    assert router.unset_default_tier() is True
    assert router.record("someone").tier is None


def test_other_publishers_see_a_new_default_after_the_refresh(client: redis.Redis, key_prefix: str) -> None:
    operator = make(client, key_prefix)
    publisher = make(client, key_prefix)
    engine_of(publisher).tier_store.refresh = 0.2
    assert publisher.record("a").tier is None
    operator.set_default_tier(fixed=9)
    assert publisher.record("b").tier is None, "kept in memory until the refresh"
    import time

    time.sleep(0.25)
    assert publisher.record("c").priority == 9


def test_a_clients_tier_is_read_in_its_check(
    client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make(client, key_prefix).set_tier("someone", shift=1)  # tiers are in use in this deployment
    router = make(client, key_prefix)
    router.record("warm")  # reads the default tier and the in-use marker (every few seconds)
    sent = record_sends(client, monkeypatch)
    make(client, key_prefix).set_tier("acme", fixed=7)
    sent.clear()
    assert router.record("acme").priority == 7
    assert len(sent) == 1, "the tier travels in the check's own round trip"
    assert router.record_many("acme", 5)[-1].priority == 7
    assert len(sent) == 2


def test_until_a_tier_is_stored_checks_leave_the_tier_out(
    client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher = make(client, key_prefix)
    engine_of(publisher).tier_store.refresh = 0.2
    publisher.record("warm")
    sent = record_sends(client, monkeypatch)
    publisher.record("acme")
    assert b"GET" not in b"".join(sent[-1]), "no tier anywhere: the bare check"
    make(client, key_prefix).set_tier("acme", fixed=8)
    assert publisher.record("acme").priority == 1, "the first tier reaches publishers at their refresh"
    import time

    time.sleep(0.25)
    assert publisher.record("acme").priority == 8
    assert b"GET" in b"".join(sent[-1])


def test_tiers_false_sends_the_bare_check_and_ignores_tiers(client: redis.Redis, key_prefix: str) -> None:
    make(client, key_prefix).set_tier("acme", fixed=9)
    bare = make(client, key_prefix, tiers=False)
    decision = bare.record("acme")
    assert (decision.priority, decision.tier) == (1, None)


def test_inflight_mode_and_batches_use_the_tier(client: redis.Redis, key_prefix: str) -> None:
    inflight = make(client, key_prefix, mode="inflight")
    inflight.set_tier("acme", weight=4)
    got = [inflight.record("acme", f"t{n}").priority for n in range(12)]
    assert got == [TABLE[int(n / 4)] for n in range(12)]
    seed = make(client, key_prefix + "s:")
    seed.set_tier("bulk", shift=1)
    assert [d.priority for d in seed.record_many("bulk", 23)] == [min(9, p + 1) for p in TABLE]


def test_peek_shows_the_tiered_priority(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    for _ in range(5):
        router.record("acme")
    router.set_tier("acme", shift=-2)
    peeked = router.peek("acme")
    assert (peeked.pending, peeked.priority, peeked.tier) == (-4, 1, "client: shift=-2")


def test_tiers_lists_every_client_with_its_own(client: redis.Redis, key_prefix: str) -> None:
    router = make(client, key_prefix)
    long_id = "x" * 200
    router.set_tier("acme", weight=2, shift=-1)
    router.set_tier(long_id, fixed=3)
    router.set_default_tier(fixed=9)
    router.record("acme")  # a counter key is not a tier
    listed = router.tiers()
    assert listed["acme"] == Tier(2, -1)
    assert [t for c, t in listed.items() if c.startswith("#")] == [Tier(fixed=3)], "long ids are hashed"
    assert len(listed) == 2
    engine_of(router).store.clear_all()
    assert len(router.tiers()) == 2, "reset --all leaves tiers: they are configuration"


def test_an_unreadable_stored_tier_never_breaks_a_publish(
    client: redis.Redis, key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    router = make(client, key_prefix)
    router.set_tier("acme", weight=2)
    client.set(engine_of(router).tier_store.key("acme"), "weight two")  # written by hand
    with caplog.at_level(logging.ERROR, logger="priority_router"):
        decisions = [router.decide("acme") for _ in range(3)]
    assert [(d.priority, d.tier) for d in decisions] == [(1, None)] * 3
    errors = [r for r in caplog.records if "tier" in r.getMessage()]
    assert len(errors) == 1 and "priority-router tier set" in errors[0].getMessage()
    with pytest.raises(ConfigurationError, match="acme"):
        router.tiers()


def test_stored_form_round_trips() -> None:
    for tier in (Tier(), Tier(2.5), Tier(shift=-3), Tier(0.5, 2), Tier(fixed=4)):
        assert decode(tier.encode()) == tier
    assert Tier(2, -1).describe() == "weight=2 shift=-1" and Tier().describe() == "neutral"
    with pytest.raises(ConfigurationError, match="tier set"):
        decode("w=2;w=3")
    assert Tier(fixed=5).priority(-100, DEFAULT_THRESHOLDS) == 5


def test_a_neutral_default_tier_is_refused_as_the_cli_refuses_it(
    client: redis.Redis, key_prefix: str
) -> None:
    router = make(client, key_prefix)
    with pytest.raises(ConfigurationError, match="unset_default_tier"):
        router.set_default_tier()
    assert router.default_tier() is None


def test_limits_leave_every_publish_exactly_as_it_was(
    client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Publishers never read limits: a deployment with caps and rates only sends the bare check."""
    publisher = make(client, key_prefix)
    engine_of(publisher).tier_store.refresh = 0  # it reads the default tier and the marker each time
    operator = make(client, key_prefix)
    publisher.record("warm")
    sent = record_sends(client, monkeypatch)
    publisher.record("acme")
    before = sent[-1]
    operator.set_tier("acme", max_in_flight=3, rate="5/s")
    operator.set_default_tier(max_in_flight=10, borrow=True)
    sent.clear()
    decision = publisher.record("acme")
    assert len(sent) == 2  # the refresh's read (as without limits), then the check
    assert b"GET" not in b"".join(sent[-1]) and len(sent[-1]) == len(before)
    assert (decision.priority, decision.tier) == (1, None)
    assert operator.default_tier() == Tier(limits=Limits(max_in_flight=10, borrow=True))
    assert operator.tier("acme") == Tier(limits=Limits(max_in_flight=3, rate="5/s"))


def _transactions(sent: list[list[bytes]]) -> list[bytes]:
    return [payload for payload in (b"".join(c) for c in sent) if payload.startswith(b"*1\r\n$5\r\nMULTI")]


def test_a_tier_and_its_limits_change_in_one_transaction(
    client: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    router = make(client, key_prefix)
    router.set_tier("acme", weight=2, max_in_flight=1)
    router.set_default_tier(shift=1, rate="5/s")
    sent = record_sends(client, monkeypatch)
    for change in (
        lambda: router.set_tier("acme", weight=3, max_in_flight=2),
        lambda: router.unset_tier("acme"),
        lambda: router.set_default_tier(shift=2, rate="9/s"),
        lambda: router.unset_default_tier(),
    ):
        sent.clear()
        change()
        (transaction,) = _transactions(sent)
        assert transaction.endswith(b"EXEC\r\n")
        # The tier's key and the limits (the hash, or the default's key) in the same one.
        assert transaction.count(key_prefix.encode()) >= 3, transaction
    assert router.tier("acme") is None and router.default_tier() is None


@pytest.mark.integration
def test_a_tier_change_cut_before_its_exec_changes_neither_the_tier_nor_its_limits(
    real_redis: redis.Redis, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.redis_wire import send_cut_before_exec

    router = make(real_redis, key_prefix)
    router.set_tier("acme", weight=2, max_in_flight=1)
    sent = record_sends(real_redis, monkeypatch)
    router.set_tier("acme", weight=3, max_in_flight=2)
    (transaction,) = _transactions(sent)
    router.set_tier("acme", weight=2, max_in_flight=1)
    send_cut_before_exec(real_redis, transaction)  # the operator's process dies mid-change
    tier = router.tier("acme")
    assert tier is not None and (tier.weight, tier.limits.max_in_flight) == (2, 1)
    assert router.limits("acme").max_in_flight == 1
