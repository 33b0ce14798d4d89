"""The discrete-event loop: slots, waits, closed loops and the order of simultaneous events."""

from __future__ import annotations

import pytest

from priority_router.simulation.engine import run
from priority_router.simulation.policies import Fifo, RouterQueue
from priority_router.simulation.trace import Trace, TraceBuilder
from priority_router.simulation.workloads import NoisyNeighbour, SteadyBurst
from priority_router.thresholds import DEFAULT_THRESHOLDS


def trace_of(*docs: tuple[float, str, float]) -> Trace:
    builder = TraceBuilder()
    for at, client, duration in docs:
        builder.add(client, client, at, duration)
    return builder.build()


def test_one_slot_serves_a_burst_back_to_back() -> None:
    schedule = run(trace_of((0, "a", 1), (0, "a", 2), (0, "a", 3)), Fifo(), workers=1)
    assert schedule.started == [0, 1, 3]
    assert schedule.finished == [1, 3, 6]
    assert schedule.published == [0, 0, 0]


def test_free_slots_start_documents_at_once_and_the_next_takes_the_first_freed_slot() -> None:
    schedule = run(trace_of((0, "a", 5), (0, "b", 2), (0, "c", 4), (1, "d", 1)), Fifo(), workers=3)
    assert schedule.started == [0, 0, 0, 2]  # d waits for b's slot, freed at 2
    assert schedule.finished[3] == 3


def test_a_document_published_to_an_idle_worker_does_not_wait() -> None:
    schedule = run(trace_of((0, "a", 1), (10, "a", 1)), Fifo(), workers=1)
    assert schedule.started == [0, 10]


def test_a_finish_and_a_publish_at_one_instant_the_waiting_document_goes_first() -> None:
    # b waits from t=0; at t=1 a finishes and c is published: the slot takes b, c waits.
    schedule = run(trace_of((0, "a", 1), (0, "b", 1), (1, "c", 1)), Fifo(), workers=1)
    assert schedule.started == [0, 1, 2]


def test_every_document_runs_once_and_one_slot_is_never_idle_with_work_waiting() -> None:
    docs = NoisyNeighbour(heavy=40, light_clients=5, light_docs=2, jitter=0.5).trace()
    schedule = run(docs, Fifo(), workers=1)
    assert sorted(schedule.started) == sorted(set(schedule.started))  # one at a time
    assert max(schedule.finished) == pytest.approx(sum(docs.duration))  # all arrive before the backlog ends
    for doc in range(len(docs)):
        assert schedule.started[doc] >= schedule.published[doc]
        assert schedule.finished[doc] == pytest.approx(schedule.started[doc] + docs.duration[doc])


def test_a_closed_loop_client_publishes_when_its_previous_document_finishes() -> None:
    workload = SteadyBurst(steady=4, burst=3, burst_after=2, doc_seconds=1, jitter=0)
    docs = workload.trace()
    schedule = run(docs, Fifo(), workers=1)
    steady = [i for i, c in enumerate(docs.client) if docs.clients[c] == "steady"]
    burst = [i for i, c in enumerate(docs.client) if docs.clients[c] == "burst"]
    # s0 at 0, s1 when s0 ends (1); the burst and s2 when s1 ends (2); FIFO: s2 after the burst.
    assert [schedule.published[i] for i in steady] == [0, 1, 2, 6]
    assert [schedule.published[i] for i in burst] == [2, 2, 2]
    assert [schedule.started[i] for i in steady] == [0, 1, 5, 6]


def test_the_router_serves_the_most_urgent_list_first_and_each_list_in_order() -> None:
    # One slot busy with heavy's first document; heavy's 2nd..6th wait at priorities 1,1,2,2,3;
    # light's document (priority 1) at t=0.5 goes before heavy's priority-2 ones.
    docs = trace_of(*[(0.0, "heavy", 1.0)] * 6, (0.5, "light", 1.0))
    queue = RouterQueue("seed", DEFAULT_THRESHOLDS, reset_interval=1500)
    schedule = run(docs, queue, workers=1)
    assert schedule.started == [0, 1, 2, 4, 5, 6, 3]


def test_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="workers"):
        run(trace_of((0, "a", 1)), Fifo(), workers=0)


def test_overhead_delays_every_start_and_keeps_the_slot_meanwhile() -> None:
    schedule = run(trace_of((0, "a", 1), (0, "a", 1), (5, "b", 1)), Fifo(), workers=1, overhead=0.25)
    assert schedule.started == [0.25, 1.5, 5.25]
    assert schedule.finished == [1.25, 2.5, 6.25]
    with pytest.raises(ValueError, match="overhead"):
        run(trace_of((0, "a", 1)), Fifo(), workers=1, overhead=-1)
