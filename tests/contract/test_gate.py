"""The gate's script (store/gate.py, store/lua/gate.lua), run on fakeredis and on a real Redis.

The store only counts; a held document's message waits in the broker.  :class:`Queue`
stands for a client's holding queue, as ``GateStore.release`` takes from it."""

from __future__ import annotations

import pytest
import redis
from support.holding_queue import Queue

from priority_router.limits import Limits
from priority_router.store.client_ids import gate_keys
from priority_router.store.gate import GateStore, Verdict

NOW = 1_700_000_000_000
ONE = 1000
REMEMBER = 3_600_000


@pytest.fixture(params=["fakeredis", pytest.param("redis", marks=pytest.mark.integration)])
def client(request: pytest.FixtureRequest) -> redis.Redis:
    return request.getfixturevalue("fake_redis" if request.param == "fakeredis" else "real_redis")


@pytest.fixture
def gate(client: redis.Redis, key_prefix: str) -> GateStore:
    return GateStore(client, key_prefix, lease=30)


@pytest.fixture
def queue() -> Queue:
    return Queue()


def admit(gate: GateStore, queue: Queue, task: str, limits: Limits, now: int = NOW, units: int = ONE) -> str:
    """A received document, as a worker's gate admits it: held ones go to ``queue``."""
    verdict = gate.admit("acme", task, limits, units, now_ms=now)
    if verdict.outcome == "held":
        queue.waiting.append((task, units))
    return verdict.outcome


def release(gate: GateStore, queue: Queue, verdict: Verdict, limits: Limits, now: int = NOW) -> list[str]:
    return gate.release("acme", limits, verdict, queue, REMEMBER, now_ms=now)[0]


def end(
    gate: GateStore, queue: Queue, task: str, limits: Limits, now: int = NOW, borrow: int = 0
) -> list[str]:
    """A document's end and the releases it allows."""
    return release(gate, queue, gate.end("acme", task, limits, borrow=borrow, now_ms=now), limits, now)


def test_a_cap_admits_up_to_n_holds_the_rest_and_each_end_releases_the_oldest(
    gate: GateStore, queue: Queue
) -> None:
    cap = Limits(max_in_flight=2)
    assert [admit(gate, queue, f"d{i}", cap) for i in range(5)] == ["run", "run", "held", "held", "held"]
    assert (gate.read("acme", now_ms=NOW).running, gate.read("acme", now_ms=NOW).held) == (2, 3)
    assert end(gate, queue, "d0", cap, NOW + 1) == ["d2"]
    assert gate.read("acme", now_ms=NOW + 1).held == 2
    # Released, it keeps its place until it arrives back, then runs without a new check.
    assert admit(gate, queue, "d2", cap, NOW + 2) == "run"
    assert gate.read("acme", now_ms=NOW + 2).running == 2
    # Ending a document twice, or one never admitted, frees nothing more.
    assert end(gate, queue, "d0", cap, NOW + 3) == []
    assert end(gate, queue, "never", cap, NOW + 3) == []
    assert gate.read("acme", now_ms=NOW + 3).running == 2
    assert [t for t, _ in queue.waiting] == ["d3", "d4"]


def test_a_blocked_release_leaves_the_document_first_in_its_queue(gate: GateStore, queue: Queue) -> None:
    cap = Limits(max_in_flight=1)
    assert [admit(gate, queue, t, cap) for t in "abc"] == ["run", "held", "held"]
    # A sweep that finds the cap full takes nothing; one told "free" by a stale word
    # takes b, finds the cap full, and puts it back first.
    assert gate.end("acme", "", cap, now_ms=NOW).state == "cap"
    assert release(gate, queue, Verdict("ended", "free", 0), cap) == []
    assert [t for t, _ in queue.waiting] == ["b", "c"]


def test_a_redelivered_held_document_is_a_duplicate_and_a_newcomer_waits_behind_the_held(
    gate: GateStore, queue: Queue
) -> None:
    cap = Limits(max_in_flight=1)
    assert admit(gate, queue, "a", cap) == "run"
    assert admit(gate, queue, "b", cap) == "held"
    assert gate.admit("acme", "b", cap, ONE, now_ms=NOW).outcome == "duplicate"
    # A limit lifted: the next arrival still queues behind b, and b is released first.
    verdict = gate.admit("acme", "c", Limits(), ONE, now_ms=NOW)
    assert (verdict.outcome, verdict.state) == ("held", "free")
    queue.waiting.append(("c", ONE))
    assert release(gate, queue, verdict, Limits()) == ["b", "c"]
    assert gate.read("acme", now_ms=NOW).held == 0


def test_a_lapsed_lease_frees_the_slot(gate: GateStore, queue: Queue) -> None:
    cap = Limits(max_in_flight=1)
    assert [admit(gate, queue, t, cap) for t in "abc"] == ["run", "held", "held"]
    # a's worker died: no end, no renewal.  Its lease lapses and b is released.
    lapsed = NOW + gate.lease_ms + 1
    assert end(gate, queue, "", cap, lapsed) == ["b"]


def test_a_copy_of_a_sent_release_is_dropped_until_the_release_arrives(gate: GateStore, queue: Queue) -> None:
    cap = Limits(max_in_flight=1)
    assert [admit(gate, queue, t, cap) for t in "abc"] == ["run", "held", "held"]
    assert end(gate, queue, "a", cap) == ["b"]
    assert queue.dropped == ["b"]
    # Its releaser was killed after publishing b, before letting go of the held copy: the
    # broker puts the copy back, first.  It is dropped, not sent twice.
    queue.waiting.appendleft(("b", ONE))
    assert release(gate, queue, Verdict("ended", "free", 0), cap, NOW + 1) == []
    assert queue.dropped == ["b", "b"] and [t for t, _ in queue.waiting] == ["c"]
    # Once b arrived, its id is free again: a retry of b held later is released.
    assert admit(gate, queue, "b", cap, NOW + 2) == "run"
    assert end(gate, queue, "b", cap, NOW + 3) == ["c"]
    assert admit(gate, queue, "b", cap, NOW + 4) == "held"
    assert end(gate, queue, "c", cap, NOW + 5) == ["b"]


def test_no_sent_mark_outlives_its_released_document(
    gate: GateStore, queue: Queue, client: redis.Redis, key_prefix: str
) -> None:
    """A soak found marks of released documents an hour after the documents ended: one that
    arrived before its releaser marked it sent, and one that arrived while the store could
    not admit it (or its client had no limits left) kept theirs until the mark's TTL."""
    cap = Limits(max_in_flight=1)
    sent = gate_keys(key_prefix, "acme")[3]
    assert [admit(gate, queue, t, cap) for t in "abc"] == ["run", "held", "held"]
    # b reaches a worker between its publish and its mark: no mark is made.
    queue.on_send = lambda task: gate.admit("acme", task, cap, ONE, now_ms=NOW + 1)
    assert end(gate, queue, "a", cap, NOW + 1) == ["b"]
    assert client.exists(sent) == 0
    assert gate.read("acme", now_ms=NOW + 1).running == 1
    # c is marked, then runs without an admission (the store was paused when it arrived):
    # its end takes the mark.
    queue.on_send = None
    assert end(gate, queue, "b", cap, NOW + 2) == ["c"]
    assert client.zrange(sent, 0, -1) == [b"c"]
    assert end(gate, queue, "c", cap, NOW + 3) == []
    assert client.exists(sent) == 0
    assert not [f for f in client.hkeys(gate_keys(key_prefix, "acme")[2]) if f.startswith((b"r:", b"w:"))]
    # A mark still protects a copy whose release is on its way (the drop test above), and its
    # document's arrival takes it, as before.


def test_a_released_document_arriving_after_its_reservation_lapsed_still_runs(
    gate: GateStore, queue: Queue
) -> None:
    cap = Limits(max_in_flight=1)
    assert [admit(gate, queue, t, cap) for t in "abc"] == ["run", "held", "held"]
    assert end(gate, queue, "a", cap) == ["b"]
    # Every worker was down longer than the lease: b's reservation lapsed, c took its slot.
    later = NOW + gate.lease_ms + 1
    assert end(gate, queue, "", cap, later) == ["c"]
    # b arrives: it went through the gate already, so it runs rather than being held again.
    assert admit(gate, queue, "b", cap, later + 1) == "run"


def test_a_release_killed_before_it_published_releases_the_document_again(
    gate: GateStore, queue: Queue
) -> None:
    cap = Limits(max_in_flight=1)
    assert [admit(gate, queue, t, cap) for t in "ab"] == ["run", "held"]
    end_a = gate.end("acme", "a", cap, now_ms=NOW)
    # The releaser takes b and reserves its slot, and is killed before publishing: the broker
    # puts the held copy back, and b is released again, in its reserved slot.
    taken = queue.take()
    assert taken is not None and gate.take("acme", "b", cap, ONE, now_ms=NOW).outcome == "run"
    taken.put_back()
    assert release(gate, queue, end_a, cap, NOW + 1) == ["b"]
    assert gate.read("acme", now_ms=NOW + 1).running == 1


def test_a_release_that_cannot_publish_gives_its_slot_back(gate: GateStore, queue: Queue) -> None:
    cap = Limits(max_in_flight=1)
    assert [admit(gate, queue, t, cap) for t in "ab"] == ["run", "held"]
    queue.fail_release = True
    with pytest.raises(ConnectionError):
        end(gate, queue, "a", cap)
    assert gate.read("acme", now_ms=NOW).running == 0


def test_renewed_leases_keep_their_slots(gate: GateStore, queue: Queue) -> None:
    cap = Limits(max_in_flight=1)
    admit(gate, queue, "a", cap)
    admit(gate, queue, "b", cap)
    gate.renew({"acme": ["a"]}, now_ms=NOW + gate.lease_ms - 1)
    assert end(gate, queue, "", cap, NOW + gate.lease_ms + 1) == []


def test_a_rate_starts_its_burst_then_one_per_interval(gate: GateStore, queue: Queue) -> None:
    rate = Limits(rate="2/s")
    assert [admit(gate, queue, f"d{i}", rate) for i in range(5)] == ["run", "run", "held", "held", "held"]
    early = gate.end("acme", "", rate, now_ms=NOW + 499)
    assert (early.state, early.due_ms) == ("rate", NOW + 500)
    assert release(gate, queue, early, rate, NOW + 499) == []
    due = gate.end("acme", "", rate, now_ms=NOW + 500)
    assert due.state == "free"
    assert gate.release("acme", rate, due, queue, REMEMBER, now_ms=NOW + 500)[1].due_ms == NOW + 1000
    assert queue.released == ["d2"]
    assert admit(gate, queue, "d2", rate, NOW + 600) == "run"  # back: it spends its token
    assert end(gate, queue, "", rate, NOW + 2000) == ["d3", "d4"]


def test_released_documents_that_come_back_together_start_no_faster_than_the_rate(
    gate: GateStore, queue: Queue
) -> None:
    # Released at the rate, they wait behind other documents of their priority and arrive
    # together: each release reserves its token and the start spends it, so no more are
    # released than the bucket can start, and none starts without its token (#42).
    rate = Limits(rate="2/s")
    assert [admit(gate, queue, f"d{i}", rate) for i in range(8)] == ["run"] * 2 + ["held"] * 6
    assert end(gate, queue, "", rate, NOW + 500) == ["d2"]
    assert end(gate, queue, "", rate, NOW + 1000) == ["d3"]
    # The bucket (2) is reserved by the two on their way: however long they take, no more go.
    blocked = gate.end("acme", "", rate, now_ms=NOW + 5000)
    assert (blocked.state, blocked.due_ms) == ("rate", NOW + 5500)
    assert release(gate, queue, blocked, rate, NOW + 5000) == []
    assert [admit(gate, queue, t, rate, NOW + 5000) for t in ("d2", "d3")] == ["run", "run"]
    # Their starts spent the bucket: the next token comes half a second later.
    assert end(gate, queue, "", rate, NOW + 5001) == []
    assert end(gate, queue, "", rate, NOW + 5500) == ["d4"]


def test_a_released_document_whose_reservation_lapsed_starts_only_with_a_free_token(
    client: redis.Redis, key_prefix: str, queue: Queue
) -> None:
    gate = GateStore(client, key_prefix, lease=1)
    rate = Limits(rate="1/s", burst=1)
    assert [admit(gate, queue, t, rate) for t in ("a", "b", "c")] == ["run", "held", "held"]
    assert end(gate, queue, "", rate, NOW + 1000) == ["b"]
    # b's lease runs out on its way back; c is released with the token b no longer holds.
    assert end(gate, queue, "", rate, NOW + 2001) == ["c"]
    assert admit(gate, queue, "c", rate, NOW + 2002) == "run"
    # b comes back with no token free: held again, and released in its turn.
    assert admit(gate, queue, "b", rate, NOW + 2003) == "held"
    assert end(gate, queue, "", rate, NOW + 3002) == ["b"]


def test_a_burst_sizes_the_bucket(gate: GateStore, queue: Queue) -> None:
    limits = Limits(rate="1/m", burst=3)
    assert [admit(gate, queue, f"d{i}", limits) for i in range(4)] == ["run", "run", "run", "held"]


def test_a_cost_cap_counts_units_and_lets_an_oversized_document_run_alone(
    gate: GateStore, queue: Queue
) -> None:
    limits = Limits(max_cost_in_flight=10)
    assert admit(gate, queue, "big", limits, units=25 * ONE) == "run"  # nothing else runs: alone
    assert admit(gate, queue, "small", limits, units=ONE) == "held"
    assert admit(gate, queue, "huge", limits, units=12 * ONE) == "held"
    assert end(gate, queue, "big", limits, NOW + 1) == ["small"]  # huge waits for small
    assert gate.read("acme", now_ms=NOW + 1).running_units == ONE
    assert [t for t, _ in queue.waiting] == ["huge"]
    assert end(gate, queue, "small", limits, NOW + 2) == ["huge"]


def test_borrowing_passes_the_cap_only_as_far_as_the_caller_lends(gate: GateStore, queue: Queue) -> None:
    limits = Limits(max_in_flight=1, borrow=True)
    assert [admit(gate, queue, t, limits) for t in "abcd"] == ["run", "held", "held", "held"]
    # A sweep saw two idle slots and an empty queue.
    assert end(gate, queue, "", limits, borrow=2) == ["b", "c"]
    # b ran beyond the cap: its end, with the queue empty, is replaced by d.
    assert end(gate, queue, "b", limits, borrow=1) == ["d"]
    # Nobody lends: the cap holds.
    admit(gate, queue, "e", limits)
    assert end(gate, queue, "c", limits, borrow=0) == []


def test_an_end_within_the_cap_borrows_nothing(gate: GateStore, queue: Queue) -> None:
    limits = Limits(max_in_flight=2, borrow=True)
    assert [admit(gate, queue, t, limits) for t in "abcd"] == ["run", "run", "held", "held"]
    # Running 2 of 2: the end frees one slot, refilled within the cap; nothing ran beyond it.
    assert end(gate, queue, "a", limits, borrow=1) == ["c"]


def test_a_store_that_lost_its_keys_counts_the_holding_queue_again(
    gate: GateStore, queue: Queue, client: redis.Redis, key_prefix: str
) -> None:
    cap = Limits(max_in_flight=1)
    assert [admit(gate, queue, t, cap) for t in "abc"] == ["run", "held", "held"]
    client.delete(*gate_keys(key_prefix, "acme"))  # restarted empty, evicted, failed over
    # Workers read the broker's index: two documents wait in the holding queue.
    marked = gate.mark("acme", len(queue.waiting), cap, now_ms=NOW)
    assert (marked.held, marked.state) == (2, "free")
    # A newcomer waits behind them; they are released first, in order.
    assert admit(gate, queue, "d", cap) == "held"
    assert release(gate, queue, marked, cap) == ["b"]
    assert end(gate, queue, "b", cap, NOW + 1) == ["c"]
    assert end(gate, queue, "c", cap, NOW + 2) == ["d"]
    assert gate.read("acme", now_ms=NOW + 2).held == 0


def test_a_held_count_left_by_a_dead_releaser_is_cleared_once_stale(gate: GateStore, queue: Queue) -> None:
    cap = Limits(max_in_flight=1)
    assert [admit(gate, queue, t, cap) for t in "ab"] == ["run", "held"]
    queue.waiting.clear()  # b went, and the store was never told
    # A hold a moment ago may still be on its way to the queue: its count stays...
    assert gate.clear("acme", cap, now_ms=NOW + 1).held == 1
    # ...and is dropped once older than any hold takes.
    assert gate.clear("acme", cap, now_ms=NOW + 60_000).held == 0


def test_every_key_of_a_client_shares_its_hash_tag(key_prefix: str) -> None:
    keys = gate_keys(key_prefix, "acme")
    tags = {key[key.index("{") : key.index("}") + 1] for key in keys}
    assert len(keys) == 4 and tags == {"{acme}"}


def test_nothing_lingers_once_a_client_has_nothing_running_or_held(
    gate: GateStore, queue: Queue, client: redis.Redis, key_prefix: str
) -> None:
    limits = Limits(max_in_flight=1)
    admit(gate, queue, "a", limits)
    gate.end("acme", "a", limits, now_ms=NOW)
    run, held, state, sent = gate_keys(key_prefix, "acme")
    assert client.exists(run, held, sent) == 0
    assert 0 < client.pttl(state) <= 2 * gate.lease_ms


def test_with_nothing_held_a_sweep_looks_again_when_the_first_lease_runs_out(
    gate: GateStore, queue: Queue
) -> None:
    cap = Limits(max_in_flight=1)
    admit(gate, queue, "a", cap)
    admit(gate, queue, "b", cap)
    assert end(gate, queue, "a", cap, NOW + 10) == ["b"]  # b's slot reserved; say it never arrives
    verdict = gate.end("acme", "", cap, now_ms=NOW + 10)
    assert (verdict.state, verdict.due_ms) == ("lease", NOW + 10 + gate.lease_ms + 1)
    assert gate.end("acme", "b", cap, now_ms=NOW + 20).state == "none"


def test_a_workers_snapshot_reads_limits_only_once_some_are_stored(
    client: redis.Redis, key_prefix: str
) -> None:
    from priority_router.store.limit_store import LimitStore, Snapshot
    from priority_router.store.writes import in_one_write

    worker, operator = LimitStore(client, key_prefix, refresh=0), LimitStore(client, key_prefix)
    assert worker.snapshot() == Snapshot()
    in_one_write(client, lambda w: operator.set("acme", Limits(max_in_flight=2), w))
    assert worker.snapshot().of("acme") == Limits(max_in_flight=2)
    in_one_write(client, lambda w: operator.set_default(Limits(rate="5/s"), w))
    assert worker.snapshot().of("anyone") == Limits(rate="5/s")
