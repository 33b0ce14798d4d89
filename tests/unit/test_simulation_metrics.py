"""What a run is summed up as, and the metrics and workloads the benchmarks share with it."""

from __future__ import annotations

import statistics

import pytest

import workers.workload
from priority_router.simulation import metrics, workloads
from priority_router.simulation.engine import Schedule
from priority_router.simulation.metrics import group_order, group_waits, jain, p95, slowdown, summarize
from priority_router.simulation.trace import TraceBuilder
from priority_router.simulation.workloads import WORKLOADS, HeavyMix, MixedSizes, NoisyNeighbour, SteadyBurst


def test_summary_of_a_hand_made_schedule() -> None:
    builder = TraceBuilder()
    for at, client, group, duration in [
        (0.0, "a", "heavy", 1.0),
        (0.0, "a", "heavy", 1.0),
        (0.0, "a", "heavy", 2.0),
        (1.0, "b", "light", 1.0),
    ]:
        builder.add(client, group, at, duration)
    trace = builder.build()
    schedule = Schedule(published=[0, 0, 0, 1], started=[0, 1, 2, 4], finished=[1, 2, 4, 5])
    outcome = summarize("fifo", trace, schedule)
    assert outcome.makespan == 5
    a, b = outcome.per_client["a"], outcome.per_client["b"]
    assert (a.documents, a.p50_wait, a.max_wait) == (3, 1, 2)
    assert a.p95_wait == pytest.approx(1.9)  # inclusive: 1 + 0.9 * (2 - 1)
    assert (b.documents, b.p50_wait, b.p95_wait, b.max_wait) == (1, 3, 3, 3)
    slowdowns = [(3 + 4) / 4, (3 + 1) / 1]
    assert outcome.jain == pytest.approx(sum(slowdowns) ** 2 / (2 * sum(s * s for s in slowdowns)))
    assert outcome.waits == [0, 1, 2, 3]
    assert group_order(trace) == ["light", "heavy"]
    assert group_waits(trace, outcome.waits) == {"light": [3], "heavy": [0, 1, 2]}


def test_p95_is_the_inclusive_95th_percentile() -> None:
    values = [float(v) for v in range(101)]
    assert p95(values) == 95.0
    assert p95([7.0]) == 7.0
    assert p95([1.0, 2.0]) == pytest.approx(statistics.quantiles([1.0, 2.0], n=20, method="inclusive")[18])


def test_slowdown_and_jain_on_the_extremes() -> None:
    assert slowdown([0.0], [2.0]) == 1.0
    assert jain([1.0, 1.0]) == 1.0
    assert jain([4.0, 0.0, 0.0, 0.0]) == 0.25


def test_the_benchmarks_use_these_very_definitions() -> None:
    for name in ("jain", "p95", "slowdown", "waits_by_group"):
        assert getattr(workers.workload, name) is getattr(metrics, name)
    for name in ("Document", "NoisyNeighbour", "SteadyBurst", "HeavyMix"):
        assert getattr(workers.workload, name) is getattr(workloads, name)


def test_a_workloads_trace_is_the_documents_it_publishes() -> None:
    workload = NoisyNeighbour(heavy=5, light_clients=2, light_docs=2, jitter=0.5, seed=3)
    docs = list(workload.documents())
    trace = workload.trace()
    assert [trace.clients[c] for c in trace.client] == [d.client_id for d in docs]
    assert trace.duration == [d.seconds for d in docs]
    assert trace.at == [d.at for d in docs]
    assert dict(zip(trace.clients, trace.groups, strict=True)) == {
        "heavy": "heavy",
        "light00": "light",
        "light01": "light",
    }
    mix = HeavyMix(heavy=(3, 2), light_clients=2, light_docs=1)
    assert [trace_doc for trace_doc in mix.trace().duration] == [d.seconds for d in mix.documents()]


def test_steady_burst_trace_is_a_closed_loop_with_the_burst_before_the_steady_document() -> None:
    workload = SteadyBurst(steady=4, burst=2, burst_after=2, jitter=0)
    trace = workload.trace()
    names = [trace.clients[c] for c in trace.client]
    assert names == ["steady", "steady", "burst", "burst", "steady", "steady"]
    assert trace.after == [-1, 0, 1, 1, 1, 4]
    assert len(trace) == workload.total


def test_built_in_workloads_are_the_benchmarks_defaults_and_seeded() -> None:
    noisy = WORKLOADS["noisy-neighbour"](7).trace()
    assert len(noisy) == 160 + 12 * 2 and len(noisy.clients) == 13
    assert WORKLOADS["steady-burst"](7).trace().duration == SteadyBurst().trace().duration
    assert WORKLOADS["heavy-mix"](7).trace().duration == HeavyMix().trace().duration
    for make in WORKLOADS.values():
        assert make(7).trace().duration == make(7).trace().duration
        assert make(8).trace().duration != make(7).trace().duration


def test_mixed_sizes_is_long_scans_next_to_short_invoices() -> None:
    trace = WORKLOADS["mixed-sizes"](7).trace()
    assert len(trace) == MixedSizes().total == 20 + 10 * 10
    assert dict(zip(trace.clients, trace.groups, strict=True)) == {
        "scans": "heavy",
        **{f"invoices{c:02d}": "light" for c in range(10)},
    }
    assert trace.at == [0.0] * 20 + [1.0] * 100
    assert all(27 <= d <= 33 for d in trace.duration[:20]) and all(
        0.9 <= d <= 1.1 for d in trace.duration[20:]
    )
    exact = MixedSizes(jitter=0).trace()
    assert set(exact.duration) == {30.0, 1.0} and exact.cost_units == []
    # Invoices go out client after client in turn, as one publisher's loop sends them.
    assert [exact.clients[c] for c in exact.client[20:23]] == ["invoices00", "invoices01", "invoices02"]


def test_most_at_once_counts_overlapping_spans_and_not_touching_ones() -> None:
    from support.simulation import most_at_once

    assert most_at_once([(0, 2), (1, 3), (2, 4)]) == 2  # the first ends as the third starts
    assert most_at_once(iter([(0, 5), (1, 2), (1.5, 3)])) == 3
    assert most_at_once([]) == 0
