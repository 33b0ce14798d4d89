"""Per-client limits in the simulator: the workers' gate (caps, cost caps, borrowing, rates)
under every queue discipline, and the issue's traces."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from support.simulation import started_of, trace_of

from priority_router import RouterConfig
from priority_router.limits import Limits
from priority_router.simulation.compare import compare
from priority_router.simulation.engine import Schedule, run
from priority_router.simulation.gate import Gate
from priority_router.simulation.metrics import Outcome
from priority_router.simulation.policies import EVERY_POLICY, Fifo, RoundRobin, build
from priority_router.simulation.tiers import Tiers, TierSpecError, load_tiers_csv, parse_tier
from priority_router.simulation.trace import Trace, TraceBuilder
from priority_router.simulation.workloads import WORKLOADS, NoisyNeighbour, SlowNeighbour, SteadyBurst
from priority_router.tiers import Tier

CONFIG = RouterConfig(max_wait=5.0)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "simulate.md"


def limits_for(docs: Trace, **by_client: Limits) -> list[Limits]:
    return [by_client.get(c, Limits()) for c in docs.clients]


def concurrency(schedule: Schedule, docs: Trace, client: str) -> int:
    """The most documents of ``client`` running at once, from their start and finish times."""
    events = sorted(
        (t, step)
        for i, c in enumerate(docs.client)
        if docs.clients[c] == client
        for t, step in ((schedule.started[i], 1), (schedule.finished[i], -1))
    )  # at one instant a finish (-1) sorts before a start (+1)
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def crowd(seed: int = 3) -> Trace:
    """heavy dumps 30 documents at 0 and sends more later; three light clients send a few."""
    rng = random.Random(seed)
    docs = [(0.0, "heavy", rng.uniform(1, 4)) for _ in range(30)]
    docs += [(rng.uniform(0, 30), "heavy", rng.uniform(1, 4)) for _ in range(20)]
    docs += [(rng.uniform(0, 40), f"light{c}", rng.uniform(0.2, 1)) for c in range(3) for _ in range(8)]
    return trace_of(*sorted(docs, key=lambda d: d[0]))


@pytest.mark.parametrize("policy", EVERY_POLICY)
def test_the_cap_is_never_exceeded_under_any_discipline(policy: str) -> None:
    docs = crowd()
    free = run(docs, build(policy, CONFIG), 6)
    assert concurrency(free, docs, "heavy") == 6, "without the cap heavy takes every slot"
    capped = run(docs, build(policy, CONFIG), 6, limits=limits_for(docs, heavy=Limits(max_in_flight=2)))
    assert concurrency(capped, docs, "heavy") == 2
    assert capped.gated[docs.clients.index("heavy")].peak == 2
    for i, d in enumerate(docs.duration):  # every document ran, once, after its publish
        assert capped.started[i] >= capped.published[i]
        assert capped.finished[i] == pytest.approx(capped.started[i] + d)
    assert len(capped.gated) == 1, "only clients with limits are reported"


def test_a_cap_that_never_binds_changes_nothing_under_any_discipline() -> None:
    # The gated loop (limits given) against the plain one, closed loops and sweeps included.
    traces = [crowd(), SteadyBurst(steady=10, burst=40).trace(), NoisyNeighbour(heavy=60, jitter=0.5).trace()]
    for docs in traces:
        for policy in EVERY_POLICY:
            plain = run(docs, build(policy, RouterConfig(max_wait=0.2)), 3, overhead=0.001)
            roomy = [Limits(max_in_flight=1000) for _ in docs.clients]
            gated = run(docs, build(policy, RouterConfig(max_wait=0.2)), 3, overhead=0.001, limits=roomy)
            assert gated.started == plain.started, policy
            assert gated.published == plain.published, policy
            assert all(g.held == 0 for g in gated.gated.values())


def test_without_limits_the_schedule_has_no_gate() -> None:
    docs = crowd()
    assert run(docs, Fifo(), 2).gated == {}
    assert run(docs, Fifo(), 2, limits=[Limits()] * len(docs.clients)).gated == {}


def test_a_held_document_frees_the_slot_for_the_next_one_at_once() -> None:
    # heavy (cap 1) has 3 documents ahead of light's in FIFO order on 2 slots.
    docs = trace_of((0, "heavy", 10), (0, "heavy", 10), (0, "heavy", 10), (0, "light", 1))
    schedule = run(docs, Fifo(), 2, limits=limits_for(docs, heavy=Limits(max_in_flight=1)))
    assert schedule.started == [0, 10, 20, 0]  # the holds cost no time: light starts at 0
    stats = schedule.gated[0]
    assert (stats.peak, stats.held, stats.held_seconds) == (1, 2, 10 + 20)


def test_a_released_document_goes_back_with_its_priority_and_runs_without_a_check() -> None:
    # Two slots, heavy capped at 1: h0 runs; the second slot takes h1 (priority 1) and holds
    # it.  light's 3 documents at 0.5 (priority 1 too): the free slot takes the first.  At 1
    # h0 ends and h1 is released to the tail of priority 1, behind light's other two; when a
    # slot takes it at 2 it runs, though heavy's count (its reservation) is at the cap.
    docs = trace_of((0, "heavy", 1), (0, "heavy", 1), *[(0.5, "light", 1)] * 3)
    schedule = run(docs, build("seed", CONFIG), 2, limits=limits_for(docs, heavy=Limits(max_in_flight=1)))
    assert started_of(schedule, docs, "heavy") == [0, 2]
    assert started_of(schedule, docs, "light") == [0.5, 1, 1.5]
    assert schedule.gated[0].held_seconds == 1


def test_held_documents_keep_their_order() -> None:
    # Lengths vary, so without the held list's order a short one could overtake.
    lengths = [5.0, 1.0, 3.0, 0.5, 2.0, 4.0, 0.2, 1.5]
    docs = trace_of(*[(0.1 * i, "heavy", d) for i, d in enumerate(lengths)])
    for policy in EVERY_POLICY:
        schedule = run(docs, build(policy, CONFIG), 4, limits=limits_for(docs, heavy=Limits(max_in_flight=2)))
        starts = started_of(schedule, docs, "heavy")
        assert starts == sorted(starts), policy


def test_a_newcomer_waits_behind_held_documents_even_when_the_limits_would_admit_it() -> None:
    # rate 2/s, bucket 1, ticks every second: h0 runs at 0; h1 is held at 0.1; the token is
    # due at 0.5 but released at the tick at 1; h2 at 0.7 finds a token, yet waits behind h1.
    docs = trace_of((0, "heavy", 0.05), (0.1, "heavy", 0.05), (0.7, "heavy", 0.05))
    rate = Limits(rate="2/s", burst=1)
    schedule = run(docs, Fifo(), 4, limits=limits_for(docs, heavy=rate), gate_tick=1.0)
    assert schedule.started == [0, 1, 2]


@pytest.mark.parametrize(
    ("rate", "burst", "seconds"), [("5/s", 10, 10), ("5/s", None, 8), ("120/m", None, 20)]
)
def test_a_rate_starts_about_r_times_t_plus_the_burst(rate: str, burst: int | None, seconds: float) -> None:
    docs = trace_of(*[(0, "heavy", 0.01)] * 1000)
    limits = Limits(rate=rate, burst=burst)
    schedule = run(docs, Fifo(), 200, limits=limits_for(docs, heavy=limits))
    assert limits.per_second is not None and limits.bucket is not None
    expected = limits.per_second * seconds + limits.bucket
    started = sum(1 for s in schedule.started if s <= seconds)
    assert expected - 1 <= started <= expected
    assert schedule.started[: limits.bucket] == [0] * limits.bucket  # the bucket is full at the start


def test_a_rate_held_document_is_released_at_most_one_tick_after_its_token_is_due() -> None:
    docs = trace_of(*[(0, "heavy", 0.01)] * 40)
    schedule = run(docs, Fifo(), 4, limits=limits_for(docs, heavy=Limits(rate="3/s", burst=2)))
    for k, start in enumerate(schedule.started[2:], start=1):
        due = k / 3  # the k-th token after the bucket's 2
        assert due - 1e-9 <= start <= due + 0.25, k
        assert math.isclose(start / 0.25, round(start / 0.25)), "releases happen on the tick grid"


def test_a_cost_cap_holds_what_would_pass_it_and_a_large_document_runs_alone() -> None:
    builder = TraceBuilder()
    for units in (15_000, 15_000, 15_000, 50_000, 15_000):
        builder.add("heavy", "heavy", 0.0, 10.0, units=units)
    builder.add("light", "light", 0.0, 1.0)
    docs = builder.build()
    schedule = run(docs, Fifo(), 4, limits=limits_for(docs, heavy=Limits(max_cost_in_flight=40)))
    # 15 + 15 run; the third would make 45: held; the 50 runs once heavy runs nothing.
    assert schedule.started == [0, 0, 10, 20, 30, 0]
    assert concurrency(schedule, docs, "heavy") == 2


def test_borrow_fills_the_pool_while_the_client_is_alone() -> None:
    docs = trace_of(*[(0, "heavy", 10)] * 12)
    capped = run(docs, Fifo(), 4, limits=limits_for(docs, heavy=Limits(max_in_flight=2)))
    borrowing = run(docs, Fifo(), 4, limits=limits_for(docs, heavy=Limits(max_in_flight=2, borrow=True)))
    assert concurrency(capped, docs, "heavy") == 2
    assert concurrency(borrowing, docs, "heavy") == 4
    # Two within the cap at 0; the two idle slots are lent at the first tick.
    assert borrowing.started[:4] == [0, 0, 0.25, 0.25]
    assert max(borrowing.finished) <= max(capped.finished) / 2 + 1


def test_borrow_stops_while_another_client_waits_and_borrowed_documents_are_not_preempted() -> None:
    # heavy (cap 2, borrow) holds all 4 slots from 0.25; light sends 10 documents at 5.
    docs = trace_of(*[(0, "heavy", 10)] * 12, *[(5, "light", 3)] * 10)
    schedule = run(docs, Fifo(), 4, limits=limits_for(docs, heavy=Limits(max_in_flight=2, borrow=True)))
    light = [i for i, c in enumerate(docs.client) if docs.clients[c] == "light"]
    assert min(schedule.started[i] for i in light) == 10, "the borrowed slots run to their end"
    last_light = max(schedule.started[i] for i in light)
    heavy = [i for i, c in enumerate(docs.client) if docs.clients[c] == "heavy"]
    for i in heavy:
        start = schedule.started[i]
        waiting = any(schedule.published[j] <= start < schedule.started[j] for j in light)
        if waiting:
            running = sum(1 for j in heavy if schedule.started[j] <= start < schedule.finished[j])
            assert running <= 2, f"heavy went beyond its cap at {start} while light waited"
    assert concurrency(schedule, docs, "heavy") == 4
    late = [schedule.started[i] for i in heavy if schedule.started[i] > last_light]
    assert late, "once light is done, heavy borrows again"


def test_an_end_replaces_a_borrowed_document_and_adds_none_to_a_client_within_its_cap() -> None:
    # As the real gate's end (store/lua/gate.lua): beyond the cap only in place of a
    # document that ran beyond it, and only while nothing is queued.
    docs = trace_of(*[(0, "heavy", 1)] * 6)
    gate = Gate(docs, [Limits(max_in_flight=2, borrow=True)])
    assert [gate.admit(d, 0, 0.0) for d in range(6)] == [True, True, False, False, False, False]
    assert gate.ended(0, 0, 1.0, queued=0) == [2]  # within the cap again: no more
    assert gate.lend(1.0, slots=1) == [3]  # an idle slot, nothing queued: beyond the cap
    assert gate.ended(1, 0, 2.0, queued=0) == [4]  # 3 ran, 1 beyond: replaced
    assert gate.ended(3, 0, 3.0, queued=1) == []  # someone waits: back to the cap
    assert gate.stats()[0].peak == 3
    # With a cost cap alone, every end with nothing queued may lend one, after the releases.
    builder = TraceBuilder()
    for _ in range(3):
        builder.add("scans", "scans", 0.0, 1.0, units=6_000)
    gate = Gate(builder.build(), [Limits(max_cost_in_flight=10, borrow=True)])
    assert [gate.admit(d, 0, 0.0) for d in range(3)] == [True, False, False]
    assert gate.ended(0, 0, 1.0, queued=0) == [1, 2]


def test_limits_hold_for_the_whole_replay() -> None:
    # No change mid-trace is modelled: the cap binds an hour in as at the start.
    docs = trace_of(*[(0, "heavy", 1)] * 5, *[(3600, "heavy", 1)] * 5)
    schedule = run(docs, Fifo(), 5, limits=limits_for(docs, heavy=Limits(max_in_flight=1)))
    assert schedule.started == [0, 1, 2, 3, 4, 3600, 3601, 3602, 3603, 3604]
    assert "limits hold for the whole replay" in " ".join(DOCS.read_text().split())


def test_limits_come_with_the_tier_own_or_default() -> None:
    tiers = Tiers({"bulk": parse_tier("weight=2,max_in_flight=3"), "vip": parse_tier("shift=-1")}, None)
    assert tiers.limits_of(["bulk", "vip", "other"]) == [Limits(max_in_flight=3), Limits(), Limits()]
    default = Tiers({"vip": parse_tier("neutral")}, parse_tier("max_in_flight=2"))
    assert default.limits_of(["vip", "other"]) == [Limits(), Limits(max_in_flight=2)]
    assert Tiers({"a": parse_tier("shift=1")}).limits_of(["a"]) is None
    # Limits alone change no priority: the router's policies read the table alone.
    assert default.prioritize(CONFIG.thresholds) is None
    assert default.limiting and not default.prioritizing


def test_rr_takes_a_held_clients_turn_and_serves_its_released_documents_later() -> None:
    docs = trace_of(*[(0, "heavy", 2)] * 4, *[(0, "light", 1)] * 4)
    schedule = run(docs, RoundRobin(), 2, limits=limits_for(docs, heavy=Limits(max_in_flight=1)))
    assert concurrency(schedule, docs, "heavy") == 1
    assert started_of(schedule, docs, "heavy") == [0, 2, 4, 6]


def test_the_gate_refuses_limits_that_do_not_match_the_clients() -> None:
    docs = trace_of((0, "a", 1), (0, "b", 1))
    with pytest.raises(ValueError, match="one entry per client"):
        Gate(docs, [Limits(max_in_flight=1)])
    with pytest.raises(ValueError, match="tick"):
        Gate(docs, [Limits(), Limits()], tick=0)


# -- the issue's traces -----------------------------------------------------------------


def backlog() -> Trace:
    """(a): heavy's 100 documents of 20-40 s at 0; ten light clients, one document of 1-3 s
    each every 60 s (6 s apart) for 15 minutes; as bench/simulate_limits.py writes it."""
    rng = random.Random(7)
    docs = [(0.0, "heavy", rng.uniform(20, 40)) for _ in range(100)]
    docs += [(60.0 * k + 6.0 * c, f"light{c:02d}", rng.uniform(1, 3)) for k in range(15) for c in range(10)]
    return trace_of(*sorted(docs, key=lambda d: d[0]))


def light_waits(outcome: Outcome) -> tuple[float, float]:
    """(the worst p95 wait, the longest wait) of the clients other than heavy."""
    light = [w for c, w in outcome.per_client.items() if c != "heavy"]
    return max(w.p95_wait for w in light), max(w.max_wait for w in light)


@pytest.mark.parametrize("trace", [backlog(), SlowNeighbour().trace()], ids=["backlog", "slow-neighbour"])
def test_the_issues_traces_with_heavy_capped_at_3_light_clients_wait_about_nothing(trace: Trace) -> None:
    policies = ("fifo", "seed", "inflight", "drr")
    free = compare(trace, policies, RouterConfig(), 4)
    capped = compare(
        trace, policies, RouterConfig(), 4, tiers=Tiers({"heavy": parse_tier("max_in_flight=3")})
    )
    for policy in policies:
        assert light_waits(free[policy])[1] > 15, f"{policy}: without the cap light waits for heavy"
        assert light_waits(capped[policy])[1] < 1, policy
        gated = capped[policy].gated["heavy"]
        assert gated.peak == 3 and gated.held > 0
        assert set(capped[policy].gated) == {"heavy"}


def test_the_slow_neighbour_workload_is_the_issues_second_trace() -> None:
    trace = WORKLOADS["slow-neighbour"](7).trace()
    heavy = [i for i, c in enumerate(trace.client) if trace.clients[c] == "heavy"]
    light = [i for i in range(len(trace)) if i not in heavy]
    assert len(heavy) == 12 and len(light) == 40 and len(trace.clients) == 9
    assert [trace.at[i] for i in heavy] == [2.0 * n for n in range(12)]
    assert all(50 <= trace.duration[i] <= 70 for i in heavy)
    assert all(1 <= trace.duration[i] <= 3 for i in light)
    assert trace.groups[trace.client[heavy[0]]] == "heavy"


# -- how limits are written: tier words and a tiers file's columns ----------------------


@pytest.mark.parametrize(
    ("text", "tier"),
    [
        ("max_in_flight=3,borrow", Tier(limits=Limits(max_in_flight=3, borrow=True))),
        ("max_in_flight=3 borrow", Tier(limits=Limits(max_in_flight=3, borrow=True))),  # as describe() writes
        ("weight=2,max_in_flight=3", Tier(weight=2, limits=Limits(max_in_flight=3))),
        (
            "fixed=1,max-in-flight=2",
            Tier(fixed=1, limits=Limits(max_in_flight=2)),
        ),  # the CLI option's spelling
        ("rate=5/s,burst=10", Tier(limits=Limits(rate="5/s", burst=10))),
        ("rate=100/m", Tier(limits=Limits(rate="100/m"))),
        ("max_cost_in_flight=40", Tier(limits=Limits(max_cost_in_flight=40))),
        (
            "shift=-1,max_cost_in_flight=40,borrow",
            Tier(shift=-1, limits=Limits(borrow=True, max_cost_in_flight=40)),
        ),
    ],
)
def test_limits_are_written_as_tier_set_names_them(text: str, tier: Tier) -> None:
    assert parse_tier(text) == tier
    assert parse_tier(tier.describe()) == tier


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("borrow", "borrow: borrow=True lets a capped client run beyond its cap"),
        ("borrow=yes", "borrow takes no value; write borrow"),
        ("burst=10", "burst: a burst is the size of a rate's bucket, but no rate is given. Fix: give rate="),
        ("rate=5", "rate: '5' is not R/s, R/m or R/h"),
        ("rate=5/d", 'Fix: use "5/s", "100/m" or "1000/h"'),
        ("max_in_flight=0", "max_in_flight: 0 is not a whole number of documents from 1 to 1,000,000"),
        ("max_in_flight=3.5", "max_in_flight: '3.5' is not a whole number of documents"),
        ("max_in_flight=3,max_in_flight=4", "max_in_flight is given twice"),
        ("rate=5/s,burst=0", "burst: 0 is not a whole number of documents"),
        ("max_cost_in_flight=-1", "max_cost_in_flight: -1.0 is not above 0"),
        ("max_cost_in_flight=lots", "max_cost_in_flight: 'lots' is not a number. Fix: use e.g. 40"),
        (
            "cap=3",
            "'cap=3' is not weight=W, shift=S or fixed=P; write e.g. weight=2,shift=-1 or fixed=9, "
            "or a limit: max_in_flight=3, borrow",
        ),
    ],
)
def test_a_bad_limit_names_the_problem_and_the_fix(text: str, message: str) -> None:
    with pytest.raises(TierSpecError) as raised:
        parse_tier(text)
    assert message in str(raised.value)


def test_a_tiers_file_may_add_limit_columns_and_old_files_still_read(tmp_path: Path) -> None:
    path = tmp_path / "tiers.csv"
    path.write_text("client_id,weight,shift,fixed\nacme,2,,\n")
    assert load_tiers_csv(path) == {"acme": Tier(weight=2)}
    path.write_text(
        "client_id,weight,shift,fixed,max_in_flight,borrow,rate,burst,max_cost_in_flight\n"
        "bulk,2,,,3,true,,,\n"
        "api,,,,,,5/s,10,\n"
        "scans,,,,,,,,40\n"
        "plain,,,,,no,,,\n"
    )
    assert load_tiers_csv(path) == {
        "bulk": Tier(weight=2, limits=Limits(max_in_flight=3, borrow=True)),
        "api": Tier(limits=Limits(rate="5/s", burst=10)),
        "scans": Tier(limits=Limits(max_cost_in_flight=40)),
        "plain": Tier(),
    }
    path.write_text("client_id,weight,shift,fixed,rate,max_in_flight\nbulk,,,,1/s,2\n")  # any, in any order
    assert load_tiers_csv(path) == {"bulk": Tier(limits=Limits(max_in_flight=2, rate="1/s"))}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "client_id,weight,shift,fixed,cap\nbulk,,,,3\n",
            "optionally followed by any of max_in_flight,borrow",
        ),
        ("client_id,weight,shift,fixed,rate,rate\nbulk,,,,1/s,1/s\n", "(each once)"),
        ("client_id,weight,shift,fixed,max_in_flight\nbulk,,,\n", "line 2: 4 field(s)"),
        (
            "client_id,weight,shift,fixed,max_in_flight\nbulk,,,,0\n",
            "line 2: max_in_flight: 0 is not a whole",
        ),
        (
            "client_id,weight,shift,fixed,borrow\nbulk,,,,maybe\n",
            "line 2: borrow 'maybe' is not true or false",
        ),
        ("client_id,weight,shift,fixed,borrow\nbulk,,,,true\n", "line 2: borrow: borrow=True lets a capped"),
        ("client_id,weight,shift,fixed,burst\nbulk,,,,10\n", "line 2: burst: a burst is the size"),
    ],
)
def test_a_bad_limit_in_a_tiers_file_names_the_line_and_the_fix(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "tiers.csv"
    path.write_text(content)
    with pytest.raises(TierSpecError) as raised:
        load_tiers_csv(path)
    assert message in str(raised.value)
