"""Queue disciplines: the router's modes and table, max_wait's sweep, DRR's fairness."""

from __future__ import annotations

import random

import pytest
from support.simulation import started_of, trace_of

from priority_router import DEFAULT_THRESHOLDS, Policy, RouterConfig
from priority_router.integration.starvation import sweep_interval
from priority_router.simulation import policies
from priority_router.simulation.compare import compare
from priority_router.simulation.engine import Schedule, run
from priority_router.simulation.metrics import summarize
from priority_router.simulation.policies import (
    EVERY_POLICY,
    POLICIES,
    DeficitRoundRobin,
    Fifo,
    RoundRobin,
    RouterQueue,
    build,
)
from priority_router.simulation.trace import Trace, TraceBuilder
from priority_router.simulation.workloads import HeavyMix, MixedSizes, NoisyNeighbour


def waits_of(schedule: Schedule, docs: Trace, client: str) -> list[float]:
    mine = [i for i, c in enumerate(docs.client) if docs.clients[c] == client]
    return [schedule.started[i] - schedule.published[i] for i in mine]


def seed(thresholds: Policy = DEFAULT_THRESHOLDS, reset_interval: float = 1500) -> RouterQueue:
    return RouterQueue("seed", thresholds, reset_interval)


def test_the_configured_table_decides_the_order() -> None:
    # heavy dumps 8 documents; light sends one at 0.5 while heavy's first runs on the one slot.
    docs = trace_of(*[(0.0, "heavy", 1.0)] * 8, (0.5, "light", 1.0))
    assert started_of(run(docs, seed(), 1), docs, "light") == [3]  # after heavy's priority-1 documents
    everyone_first = Policy.from_rows([(-1000, 9)], fallback=1)
    assert started_of(run(docs, seed(everyone_first), 1), docs, "light") == [8]  # one list: FIFO
    strict = Policy.from_rows([(0, 9)], fallback=1)  # only the first document of a spell is urgent
    assert started_of(run(docs, seed(strict), 1), docs, "light") == [1]


def test_seed_count_resets_after_the_interval_idle() -> None:
    # heavy's 7th document, 20 s after its first 6, is back at priority 1 with a 10 s reset
    # and at 3 (pending -6) without: it goes after medium's priority-1 documents
    # (1, 1, 1) or after all five (1, 1, 1, 2, 2).
    docs = trace_of(
        *[(0.0, "heavy", 1.0)] * 6,
        (20.0, "blocker", 1.0),
        *[(20.1, "medium", 1.0)] * 5,
        (20.2, "heavy", 1.0),
    )
    reset = run(docs, seed(reset_interval=10), 1)
    kept = run(docs, seed(reset_interval=1500), 1)
    assert started_of(reset, docs, "heavy")[-1] == 24
    assert started_of(kept, docs, "heavy")[-1] == 26


def test_inflight_counts_waiting_work_where_seed_counts_the_spell() -> None:
    # docs/scheme.md's known weakness: a client sending one document at a time drifts to
    # priority 9 in the seed mode although nothing of it waits; inflight keeps it at 1.
    steady = [(float(t), "steady", 0.1) for t in range(25)]
    docs = trace_of(*steady, (24.2, "burst", 1.0), *[(24.2, "burst", 1.0)] * 4, (24.5, "steady", 0.1))
    seed_waits = waits_of(run(docs, seed(), 1), docs, "steady")
    inflight_waits = waits_of(run(docs, RouterQueue("inflight", DEFAULT_THRESHOLDS, 1500), 1), docs, "steady")
    assert seed_waits[-1] == pytest.approx(4.7)  # priority 9: behind the whole burst
    assert inflight_waits[-1] == pytest.approx(2.7)  # priority 1: behind the burst's priority-1 documents


def test_inflight_ends_free_the_count() -> None:
    # 1 slot: heavy's first 10 documents are 2 s apart and each ends before the next, so
    # at its 11th only the 10th is in flight (pending -1, priority 1), while the seed
    # count is at -10 (priority 5): the 11th goes before other's priority-2 documents or
    # after them.
    docs = trace_of(
        *[(2.0 * t, "heavy", 1.0) for t in range(10)], *[(18.0, "other", 1.0)] * 5, (18.0, "heavy", 1.0)
    )
    inflight = run(docs, RouterQueue("inflight", DEFAULT_THRESHOLDS, 1500), 1)
    seeded = run(docs, seed(), 1)
    assert started_of(inflight, docs, "heavy")[-1] == 22
    assert started_of(seeded, docs, "heavy")[-1] == 24


def test_inflight_keeps_each_clients_order_as_its_count_falls() -> None:
    # One slot, 80 documents, 10 more once 70 have started: by the count (10 in flight) the
    # 10 would go out at priority 5 ahead of the 9 older ones still waiting at 9.
    docs = trace_of(*[(0.0, "acme", 1.0)] * 80, *[(70.5, "acme", 1.0)] * 10)
    for policy in ("fifo", "seed", "inflight", "drr"):
        outcome = summarize(policy, docs, run(docs, build(policy, RouterConfig()), 1))
        assert outcome.overtakes == 0, policy
        assert started_of(run(docs, build(policy, RouterConfig()), 1), docs, "acme") == list(range(90))


def test_overtakes_count_documents_that_start_before_an_older_one_of_their_client() -> None:
    # a0 a1 b0 a2 published in that order; a2 starts first, then a1, b0, a0.
    docs = trace_of((0.0, "a", 1.0), (0.1, "a", 1.0), (0.2, "b", 1.0), (0.3, "a", 1.0))
    schedule = Schedule(published=[0.0, 0.1, 0.2, 0.3], started=[9.0, 5.0, 6.0, 1.0], finished=[10.0] * 4)
    outcome = summarize("made up", docs, schedule)
    assert {c: w.overtakes for c, w in outcome.per_client.items()} == {"a": 2, "b": 0}
    assert outcome.overtakes == 2


def test_a_sweep_promotes_what_is_overdue_oldest_first_ahead_of_every_priority() -> None:
    queue = RouterQueue("seed", DEFAULT_THRESHOLDS, 1500, max_wait=1.0)
    docs = trace_of(*[(0.1 * i, "heavy", 1.0) for i in range(25)], (3.0, "light", 1.0))
    published = [0.0] * 26
    queue.prepare(docs, published)
    for doc in range(26):  # heavy's priorities 1,1,1,2,2,...,8 (docs 15..20), 9 (21..24); light's 1
        published[doc] = docs.at[doc]
        queue.publish(doc, docs.client[doc], docs.at[doc])
    queue.sweep(3.0)  # the cutoff 2.0 s: heavy's documents 0..20 are overdue
    assert [queue.take() for _ in range(26)] == [*range(21), 25, 21, 22, 23, 24]


def test_without_a_sweep_priorities_alone_decide() -> None:
    queue = RouterQueue("seed", DEFAULT_THRESHOLDS, 1500, max_wait=1.0)
    docs = trace_of(*[(0.1 * i, "heavy", 1.0) for i in range(6)], (3.0, "light", 1.0))
    published = [0.0] * 7
    queue.prepare(docs, published)
    for doc in range(7):
        published[doc] = docs.at[doc]
        queue.publish(doc, docs.client[doc], docs.at[doc])
    assert [queue.take() for _ in range(7)] == [0, 1, 2, 6, 3, 4, 5]


def test_overdue_documents_wait_for_the_next_sweep_on_the_grid() -> None:
    # max_wait 2 s, swept every 0.5 s from the first publish (0): heavy's priority-2
    # document, published at 0.1, is overdue at 2.1 and promoted by the sweep at 2.5,
    # ahead of the stream of priority-1 documents from new clients that keeps the slot busy.
    stream = [(0.25 * i, f"new{i}", 0.25) for i in range(1, 40)]
    docs = trace_of((0.0, "starter", 0.25), *[(0.1, "heavy", 0.25)] * 4, *stream)
    bounded = run(docs, RouterQueue("seed", DEFAULT_THRESHOLDS, 1500, max_wait=2.0), 1)
    strict = run(docs, RouterQueue("seed", DEFAULT_THRESHOLDS, 1500), 1)
    assert started_of(bounded, docs, "heavy")[3] == pytest.approx(2.5)
    assert started_of(strict, docs, "heavy")[3] == pytest.approx(10.75)  # after the whole stream


def test_one_sweep_moves_at_most_the_scripts_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policies, "SWEEP_LIMIT", 10)
    queue = RouterQueue("seed", DEFAULT_THRESHOLDS, 1500, max_wait=1.0)
    docs = trace_of(*[(0.0, "heavy", 1.0)] * 40)
    published = [0.0] * 40
    queue.prepare(docs, published)
    for doc in range(40):
        queue.publish(doc, 0, 0.0)
    queue.sweep(100.0)
    assert len(queue._lists[0]) == 10
    queue.sweep(101.0)
    assert len(queue._lists[0]) == 20


def test_max_wait_bounds_a_starved_client_under_a_stream_of_urgent_documents() -> None:
    # bench/starvation.py's shape: heavy dumps 25 documents, then a new light client every
    # 20 ms for 15 s asks for more than 2 slots can do (50 ms documents).
    stream = [(0.05 + 0.02 * i, f"light{i}", 0.05) for i in range(750)]
    docs = trace_of(*[(0.0, "heavy", 0.05)] * 25, *stream)
    strict = run(docs, RouterQueue("seed", DEFAULT_THRESHOLDS, 1500), 2)
    bounded = run(docs, RouterQueue("seed", DEFAULT_THRESHOLDS, 1500, max_wait=3.0), 2)
    assert max(waits_of(strict, docs, "heavy")) > 14  # until the stream ends
    # Overdue at 3 s, promoted within one sweep interval, then behind at most the 25
    # documents promoted with or before it, on 2 slots.
    bound = 3.0 + sweep_interval(3.0) + 25 * 0.05 / 2 + 0.05
    assert max(waits_of(bounded, docs, "heavy")) <= bound


def test_drr_alternates_between_backlogged_clients_by_work() -> None:
    # A blocker holds the one slot while a's 1 s and b's 0.5 s documents arrive; then each
    # turn is worth 1 s: one of a's documents, two of b's.
    docs = trace_of((0.0, "blocker", 1.0), *[(0.0, "a", 1.0)] * 3, *[(0.0, "b", 0.5)] * 8)
    schedule = run(docs, DeficitRoundRobin(quantum=1.0), 1)
    by_start = sorted(range(len(docs)), key=lambda i: schedule.started[i])
    order = [docs.clients[docs.client[i]] for i in by_start]
    assert order == ["blocker", "a", "b", "b", "a", "b", "b", "a", "b", "b", "b", "b"]


def test_drr_gives_a_newcomer_the_next_turn_whatever_the_backlog() -> None:
    docs = trace_of(*[(0.0, "heavy", 1.0)] * 50, (10.5, "light", 1.0))
    assert started_of(run(docs, DeficitRoundRobin(), 1), docs, "light") == [11]
    assert started_of(run(docs, Fifo(), 1), docs, "light") == [50]


def test_drr_default_quantum_is_the_longest_document() -> None:
    docs = trace_of((0.0, "a", 0.2), (0.0, "a", 3.0), (0.0, "b", 1.0))
    drr = DeficitRoundRobin()
    run(docs, drr, 1)
    assert drr._q == 3.0


def light_max_waits(docs: Trace, names: tuple[str, ...], workers: int) -> dict[str, float]:
    """Each policy's longest wait of a light-group document."""
    light = {c for c, g in enumerate(docs.groups) if g == "light"}
    longest = {}
    for name in names:
        outcome = summarize(name, docs, run(docs, build(name, RouterConfig()), workers))
        longest[name] = max(w for c, w in zip(docs.client, outcome.waits, strict=True) if c in light)
    return longest


def test_drr_serves_light_clients_of_a_heavy_mix_at_once() -> None:
    light = light_max_waits(HeavyMix().trace(), ("fifo", "drr"), 4)
    assert light["drr"] < 0.1 < 1.0 < light["fifo"]


def test_seed_matches_the_ideal_on_the_noisy_neighbour() -> None:
    docs = NoisyNeighbour(heavy=160, light_clients=12, light_docs=2, doc_seconds=0.05, jitter=0.5).trace()
    light = light_max_waits(docs, ("fifo", "seed", "drr"), 4)
    assert light["seed"] < 0.1 < 1.0 < light["fifo"]
    assert light["drr"] < 0.1


def test_build_names_every_policy_and_refuses_the_rest() -> None:
    config = RouterConfig(max_wait=5)
    built = {name: build(name, config) for name in POLICIES}
    assert isinstance(built["fifo"], Fifo) and isinstance(built["drr"], DeficitRoundRobin)
    assert built["inflight+max_wait"].sweep_every == sweep_interval(5)
    assert built["seed"].sweep_every is None
    with pytest.raises(ValueError, match="not a policy"):
        build("lifo", config)
    with pytest.raises(ValueError, match="needs a max_wait"):
        build("seed+max_wait", RouterConfig())


# -- rr, drr by cost, and counting by cost on documents of mixed sizes ---------------------


def order_of(docs: Trace, schedule: Schedule) -> list[str]:
    by_start = sorted(range(len(docs)), key=lambda i: schedule.started[i])
    return [docs.clients[docs.client[i]] for i in by_start]


def costed(*docs: tuple[float, str, float, int]) -> Trace:
    """``(at, client, duration, cost units)`` documents."""
    builder = TraceBuilder()
    for at, client, duration, units in docs:
        builder.add(client, client, at, duration, units=units)
    return builder.build()


def test_rr_serves_one_document_per_client_per_turn_whatever_it_costs() -> None:
    docs = costed((0.0, "blocker", 1.0, 1000), *[(0.0, "a", 5.0, 9000)] * 3, *[(0.0, "b", 0.5, 1000)] * 4)
    assert order_of(docs, run(docs, RoundRobin(), 1)) == ["blocker", "a", "b", "a", "b", "a", "b", "b"]
    newcomer = costed(*[(0.0, "heavy", 1.0, 1000)] * 50, (10.5, "light", 1.0, 1000))
    assert started_of(run(newcomer, RoundRobin(), 1), newcomer, "light") == [11]


def test_drr_shares_by_cost_when_documents_have_costs() -> None:
    # Every document takes 1 s, but a's cost 2 and b's 1: a turn worth 2 serves one of a's,
    # two of b's.  By seconds (no costs) it would alternate one and one.
    docs = costed((0.0, "blocker", 1.0, 1000), *[(0.0, "a", 1.0, 2000)] * 3, *[(0.0, "b", 1.0, 1000)] * 6)
    drr = DeficitRoundRobin()
    assert order_of(docs, run(docs, drr, 1)) == ["blocker", "a", "b", "b", "a", "b", "b", "a", "b", "b"]
    assert drr._q == 2000  # the largest cost, in units
    given = DeficitRoundRobin(quantum=1)  # a quantum given as a cost: a needs two turns
    run(docs, given, 1)
    assert given._q == 1000


def test_drr_by_an_equal_cost_is_rr() -> None:
    rng = random.Random(5)
    rows = sorted((rng.uniform(0, 20), rng.choice("abcdef"), rng.uniform(0.1, 3.0)) for _ in range(400))
    docs = costed(*[(at, c, d, 2500) for at, c, d in rows])
    assert run(docs, DeficitRoundRobin(), 3) == run(docs, RoundRobin(), 3)


def test_every_policy_includes_rr_which_is_no_default() -> None:
    assert EVERY_POLICY == ("fifo", "seed", "seed+max_wait", "inflight", "inflight+max_wait", "rr", "drr")
    assert tuple(p for p in EVERY_POLICY if p != "rr") == POLICIES
    assert isinstance(build("rr", RouterConfig()), RoundRobin)


def invoice_p95(outcome_waits: dict[str, float]) -> float:
    return max(w for c, w in outcome_waits.items() if c.startswith("invoices"))


def mixed_sizes(workload: MixedSizes) -> dict[str, tuple[float, float]]:
    """(the invoice clients' worst p95 wait, makespan) per policy, by document and by seconds."""
    docs = workload.trace()
    found = {}
    for cost in ("column", "duration"):
        for name, o in compare(
            docs, ["fifo", "seed", "inflight", "rr", "drr"], RouterConfig(), 4, cost=cost
        ).items():
            waits = {c: w.p95_wait for c, w in o.per_client.items()}
            found[f"{name} {cost}"] = (invoice_p95(waits), o.makespan)
    return found


def test_mixed_sizes_with_exact_lengths_gives_the_issues_figures() -> None:
    found = mixed_sizes(MixedSizes(jitter=0))
    assert found["seed column"][0] == found["inflight column"][0] == pytest.approx(91.35)  # 90 s measured
    assert found["fifo column"][0] == pytest.approx(172.1)  # 171 s measured
    assert found["drr column"][0] == pytest.approx(61.0)  # 60 s: by seconds, every cost being 1
    assert found["seed duration"][0] == found["inflight duration"][0] == pytest.approx(52.1)  # ~52 s modelled
    assert found["drr duration"] == found["drr column"]  # by seconds either way
    assert found["rr column"] == found["rr duration"]


@pytest.mark.parametrize("jitter", [0.0, 0.1])
def test_counting_seconds_serves_small_clients_next_to_large_documents(jitter: float) -> None:
    found = mixed_sizes(MixedSizes(jitter=jitter))
    for mode in ("seed", "inflight"):
        by_seconds, by_document = found[f"{mode} duration"], found[f"{mode} column"]
        assert by_seconds[0] <= 0.6 * by_document[0]
        assert by_seconds[0] <= found["drr duration"][0]
        assert by_seconds[1] <= 1.05 * found["fifo column"][1]  # and the work is done as soon
