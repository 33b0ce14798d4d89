"""Tiers in the simulator: the router's own rule, which policies they change, and how they are written."""

from __future__ import annotations

import random
from pathlib import Path

import fakeredis
import pytest
from support.simulation import started_of, trace_of

from priority_router import DEFAULT_THRESHOLDS, Policy, PriorityRouter, RouterConfig
from priority_router.simulation.compare import compare
from priority_router.simulation.engine import run
from priority_router.simulation.policies import POLICIES, RouterQueue, build
from priority_router.simulation.tiers import (
    Tiers,
    TierSpecError,
    load_tiers_csv,
    parse_client_tier,
    parse_tier,
)
from priority_router.tiers import Tier

CUSTOM = Policy.from_rows([(-6, 9), (-3, 5), (0, 3)], fallback=1)


@pytest.mark.parametrize("thresholds", [DEFAULT_THRESHOLDS, CUSTOM], ids=["docbits", "custom"])
@pytest.mark.parametrize("default", [None, Tier(shift=1), Tier(fixed=9), Tier(weight=0.5)], ids=str)
def test_prioritize_gives_the_routers_own_decisions(thresholds: Policy, default: Tier | None) -> None:
    """Client by client and document by document, what a PriorityRouter with the same tiers decides."""
    own = {
        "paid": Tier(shift=-1),
        "big": Tier(weight=2),
        "tiny": Tier(weight=0.3, shift=2),
        "internal": Tier(fixed=1),
        "abusive": Tier(fixed=9),
        "exempt": Tier(),  # neutral: the default tier does not apply to it
    }
    router = PriorityRouter(
        redis_client=fakeredis.FakeRedis(), key_prefix="sim-tiers:", thresholds=thresholds
    )
    for client, tier in own.items():
        router.set_tier(client, weight=tier.weight, shift=tier.shift, fixed=tier.fixed)
    if default is not None:
        router.set_default_tier(weight=default.weight, shift=default.shift, fixed=default.fixed)
    prioritize = Tiers(own, default).prioritize(thresholds)
    assert prioritize is not None

    rng = random.Random(14)
    clients = [*own, "anyone", "someone"]
    for _ in range(600):
        client = rng.choice(clients)
        decision = router.record(client)
        assert decision.pending is not None
        assert prioritize(client, decision.pending) == decision.priority, (client, decision)


def test_without_tiers_there_is_nothing_to_apply() -> None:
    assert not Tiers()
    assert Tiers().prioritize(DEFAULT_THRESHOLDS) is None
    assert Tiers({}, Tier(shift=1)) and Tiers({"a": Tier()})
    assert Tiers({"a": Tier(shift=1)}, Tier(fixed=2)).tier_of("b") == Tier(fixed=2)


# heavy dumps 8 documents; light sends one at 0.5 while heavy's first runs on the one slot.
NOISY = trace_of(*[(0.0, "heavy", 1.0)] * 8, (0.5, "light", 1.0))


@pytest.mark.parametrize("mode", ["seed", "inflight"])
def test_tiers_change_the_router_policies(mode: str) -> None:
    def light_start(tiers: Tiers | None) -> float:
        prioritize = None if tiers is None else tiers.prioritize(DEFAULT_THRESHOLDS)
        queue = RouterQueue(mode, DEFAULT_THRESHOLDS, 1500, prioritize=prioritize)
        return started_of(run(NOISY, queue, 1), NOISY, "light")[0]

    assert light_start(None) == 3  # after heavy's priority-1 documents (pending 0, -1, -2)
    assert light_start(Tiers({"heavy": Tier(fixed=1)})) == 8  # heavy all at 1: first in first out
    assert light_start(Tiers({"light": Tier(fixed=9)})) == 8  # light behind everything
    assert light_start(Tiers({"heavy": Tier(shift=1)})) == 1  # heavy from priority 2: light goes next
    assert light_start(Tiers({"heavy": Tier(weight=2)})) == 6  # pending /2: 6 documents at 1
    assert light_start(Tiers({}, Tier(fixed=9))) == 8  # both at 9 by default: FIFO
    assert light_start(Tiers({"light": Tier()}, Tier(fixed=9))) == 1  # light exempt: the table's 1


def test_build_applies_tiers_to_seed_and_inflight_with_and_without_max_wait() -> None:
    config = RouterConfig(max_wait=100.0)
    tiers = Tiers({"light": Tier(fixed=9)})
    for name in POLICIES:
        plain = run(NOISY, build(name, config), 1)
        tiered = run(NOISY, build(name, config, tiers=tiers), 1)
        if name in ("fifo", "drr"):
            assert tiered.started == plain.started, f"{name} has no priorities: tiers change nothing"
        else:
            assert started_of(tiered, NOISY, "light") == [8], name
            assert started_of(plain, NOISY, "light")[0] < 8, name


def test_max_wait_still_promotes_a_document_its_tier_put_last() -> None:
    # A blocker holds the one slot; light (fixed=9) is published at 0.1, then heavy dumps 8
    # documents at priority 1.  Without max_wait light waits for all of them; with 2 s, the
    # sweep at 2.5 moves the overdue documents to step 0 oldest first, light ahead.
    docs = trace_of((0.0, "blocker", 1.0), (0.1, "light", 1.0), *[(0.2, "heavy", 1.0)] * 8)
    tiers = Tiers({"light": Tier(fixed=9), "heavy": Tier(fixed=1)}).prioritize(DEFAULT_THRESHOLDS)

    def light_start(max_wait: float | None) -> list[float]:
        queue = RouterQueue("seed", DEFAULT_THRESHOLDS, 1500, max_wait=max_wait, prioritize=tiers)
        return started_of(run(docs, queue, 1), docs, "light")

    assert light_start(None) == [9]
    assert light_start(2.0) == [3]


def test_compare_passes_the_tiers_to_every_router_policy() -> None:
    config = RouterConfig(max_wait=100.0)
    outcomes = compare(NOISY, POLICIES, config, 1, tiers=Tiers({"light": Tier(fixed=9)}))
    untiered = compare(NOISY, POLICIES, config, 1)
    for name in POLICIES:
        light = outcomes[name].per_client["light"].max_wait
        if name in ("fifo", "drr"):
            assert light == untiered[name].per_client["light"].max_wait
        else:
            assert light == pytest.approx(7.5), name  # starts at 8, published at 0.5


@pytest.mark.parametrize(
    ("text", "tier"),
    [
        ("weight=2,shift=-1", Tier(weight=2, shift=-1)),
        ("weight=2 shift=-1", Tier(weight=2, shift=-1)),  # as `tier list` and Decision.tier write it
        (" shift=1 , weight=0.5 ", Tier(weight=0.5, shift=1)),
        ("fixed=9", Tier(fixed=9)),
        ("FIXED=1", Tier(fixed=1)),
        ("neutral", Tier()),
    ],
)
def test_a_tier_is_written_as_tier_set_names_it(text: str, tier: Tier) -> None:
    assert parse_tier(text) == tier


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the tier is empty"),
        ("weight", "'weight' is not weight=W, shift=S or fixed=P"),
        ("heavy=2", "'heavy=2' is not weight=W"),
        ("neutral,shift=1", "neutral stands alone"),
        ("weight=", "'weight=' is not"),
        ("weight=2,weight=3", "weight is given twice"),
        ("weight=fast", "weight 'fast' is not a number"),
        ("shift=-1.5", "shift '-1.5' is not a whole number"),
        ("fixed=one", "fixed 'one' is not a whole number"),
        ("weight=0", "tier weight: 0.0 is not above 0"),
        ("weight=inf", "tier weight"),
        ("shift=9", "tier shift"),
        ("fixed=10", "tier fixed"),
        ("fixed=1,shift=1", "give either fixed, or weight and/or shift"),
    ],
)
def test_a_bad_tier_names_the_problem_and_the_fix(text: str, message: str) -> None:
    with pytest.raises(TierSpecError) as raised:
        parse_tier(text)
    assert message in str(raised.value)
    assert (
        "write e.g." in str(raised.value)
        or "Fix:" in str(raised.value)
        or "give it once" in str(raised.value)
    )
    assert isinstance(raised.value, ValueError)


def test_client_tiers_split_at_the_first_equals_sign() -> None:
    assert parse_client_tier("acme=weight=2,shift=-1") == ("acme", Tier(weight=2, shift=-1))
    assert parse_client_tier(" acme =fixed=1") == (
        "acme",
        Tier(fixed=1),
    )  # ids are stripped, as the router does
    assert parse_client_tier("a:b/c=neutral") == ("a:b/c", Tier())
    for text in ("acme", "=fixed=1", "  =fixed=1"):
        with pytest.raises(TierSpecError, match="is not CLIENT=TIER"):
            parse_client_tier(text)
    with pytest.raises(TierSpecError, match=r"^acme: tier fixed"):
        parse_client_tier("acme=fixed=0")


def test_a_tiers_file_has_one_client_per_line(tmp_path: Path) -> None:
    path = tmp_path / "tiers.csv"
    path.write_text('client_id,weight,shift,fixed\nacme,2,-1,\ninternal,,,1\n\n"big, inc",0.5,,\nexempt,,,\n')
    assert load_tiers_csv(path) == {
        "acme": Tier(weight=2, shift=-1),
        "internal": Tier(fixed=1),
        "big, inc": Tier(weight=0.5),
        "exempt": Tier(),
    }
    path.write_text("Client,Weight,Shift,Fixed\nacme,,1,\n")  # `client` too, any case
    assert load_tiers_csv(path) == {"acme": Tier(shift=1)}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "the file is empty"),
        ("client_id,weight\nacme,2\n", "line 1: the header is 'client_id,weight'"),
        ("client_id,weight,shift,fixed\nacme,2\n", "line 2: 2 field(s)"),
        ("client_id,weight,shift,fixed\n ,2,,\n", "line 2: the client_id is empty"),
        (
            "client_id,weight,shift,fixed\nacme,2,,\n\nacme,,1,\n",
            "line 4: 'acme' already has a tier on line 2",
        ),
        ("client_id,weight,shift,fixed\nacme,x,,\n", "line 2: weight 'x' is not a number"),
        ("client_id,weight,shift,fixed\nacme,,+-1,\n", "line 2: shift '+-1' is not a whole number"),
        (
            "client_id,weight,shift,fixed\nacme,,,10\n",
            "line 2: tier fixed: priority 10 is outside 1..9. Fix:",
        ),
        ("client_id,weight,shift,fixed\nacme,2,,1\n", "line 2: tier: fixed=1 gives every document"),
    ],
)
def test_a_bad_tiers_file_names_the_line_and_the_fix(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "tiers.csv"
    path.write_text(content)
    with pytest.raises(TierSpecError) as raised:
        load_tiers_csv(path)
    assert message in str(raised.value)


def test_a_tiers_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tiers.csv"
    path.write_bytes(b"client_id,weight,shift,fixed\n\xff\xfe,2,,\n")
    with pytest.raises(TierSpecError, match="not UTF-8"):
        load_tiers_csv(path)


def test_missing_and_summary_describe_the_tiers() -> None:
    tiers = Tiers({"b": Tier(shift=1), "a": Tier(fixed=2), "c": Tier()}, Tier(fixed=9))
    assert tiers.missing(["c", "x"]) == ["a", "b"]
    assert tiers.summary() == "tiers for 3 client(s), default tier fixed=9"
    assert Tiers({}, Tier(weight=2)).summary() == "default tier weight=2"
