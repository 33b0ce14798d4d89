"""The gate's script (store/gate.py, store/lua/gate.lua), run on fakeredis and on a real Redis."""

from __future__ import annotations

import pytest
import redis

from priority_router.limits import Limits
from priority_router.store.client_ids import gate_keys
from priority_router.store.gate import GateStore

NOW = 1_700_000_000_000
ONE = 1000


@pytest.fixture(params=["fakeredis", pytest.param("redis", marks=pytest.mark.integration)])
def client(request: pytest.FixtureRequest) -> redis.Redis:
    return request.getfixturevalue("fake_redis" if request.param == "fakeredis" else "real_redis")


@pytest.fixture
def gate(client: redis.Redis, key_prefix: str) -> GateStore:
    return GateStore(client, key_prefix, lease=30)


def admit(gate: GateStore, task: str, limits: Limits, now: int = NOW, units: int = ONE) -> str:
    return gate.admit("acme", task, limits, units, f"message of {task}".encode(), now_ms=now).outcome


def test_a_cap_admits_up_to_n_holds_the_rest_and_each_end_releases_the_oldest(gate: GateStore) -> None:
    cap = Limits(max_in_flight=2)
    assert [admit(gate, f"d{i}", cap) for i in range(5)] == ["run", "run", "held", "held", "held"]
    assert gate.read("acme", now_ms=NOW).running == 2
    ended = gate.end("acme", "d0", cap, now_ms=NOW + 1)
    assert ended.released == [("d2", b"message of d2")]
    assert ended.state == "cap"
    # Released, it keeps its place until it arrives back, then runs without a new check.
    gate.forget("acme", "d2")
    assert admit(gate, "d2", cap, NOW + 2) == "run"
    assert gate.read("acme", now_ms=NOW + 2).running == 2
    # Ending a document twice, or one never admitted, frees nothing more.
    assert gate.end("acme", "d0", cap, now_ms=NOW + 3).released == []
    assert gate.end("acme", "never", cap, now_ms=NOW + 3).released == []
    assert gate.read("acme", now_ms=NOW + 3).running == 2


def test_a_redelivered_held_document_is_a_duplicate_and_a_newcomer_waits_behind_the_held(
    gate: GateStore,
) -> None:
    cap = Limits(max_in_flight=1)
    assert admit(gate, "a", cap) == "run"
    assert admit(gate, "b", cap) == "held"
    assert admit(gate, "b", cap) == "duplicate"
    # A limit lifted: the next arrival still queues behind b, and b is released first.
    verdict = gate.admit("acme", "c", Limits(), ONE, b"c", now_ms=NOW)
    assert verdict.outcome == "held"
    assert [task for task, _ in verdict.released] == ["b", "c"]


def test_a_lapsed_lease_frees_the_slot_and_returns_an_unpublished_release_to_the_front(
    gate: GateStore,
) -> None:
    cap = Limits(max_in_flight=1)
    assert [admit(gate, t, cap) for t in "abc"] == ["run", "held", "held"]
    # a's worker died: no end, no renewal.  Its lease lapses and b is released...
    lapsed = NOW + gate.lease_ms + 1
    assert [t for t, _ in gate.end("acme", "", cap, now_ms=lapsed).released] == ["b"]
    # ...and that worker died too, before publishing b: b goes back first, released again.
    later = lapsed + gate.lease_ms + 1
    assert [t for t, _ in gate.end("acme", "", cap, now_ms=later).released] == ["b"]
    assert gate.read("acme", now_ms=later).held == 1


def test_renewed_leases_keep_their_slots(gate: GateStore) -> None:
    cap = Limits(max_in_flight=1)
    admit(gate, "a", cap)
    admit(gate, "b", cap)
    gate.renew({"acme": ["a"]}, now_ms=NOW + gate.lease_ms - 1)
    assert gate.end("acme", "", cap, now_ms=NOW + gate.lease_ms + 1).released == []


def test_a_rate_starts_its_burst_then_one_per_interval(gate: GateStore) -> None:
    rate = Limits(rate="2/s")
    assert [admit(gate, f"d{i}", rate) for i in range(5)] == ["run", "run", "held", "held", "held"]
    early = gate.end("acme", "", rate, now_ms=NOW + 499)
    assert (early.state, early.due_ms, early.released) == ("rate", NOW + 500, [])
    due = gate.end("acme", "", rate, now_ms=NOW + 500)
    assert [t for t, _ in due.released] == ["d2"]
    assert due.due_ms == NOW + 1000
    assert [t for t, _ in gate.end("acme", "", rate, now_ms=NOW + 2000).released] == ["d3", "d4"]


def test_a_burst_sizes_the_bucket(gate: GateStore) -> None:
    limits = Limits(rate="1/m", burst=3)
    assert [admit(gate, f"d{i}", limits) for i in range(4)] == ["run", "run", "run", "held"]


def test_a_cost_cap_counts_units_and_lets_an_oversized_document_run_alone(gate: GateStore) -> None:
    limits = Limits(max_cost_in_flight=10)
    assert admit(gate, "big", limits, units=25 * ONE) == "run"  # nothing else runs: alone
    assert admit(gate, "small", limits, units=ONE) == "held"
    released = gate.end("acme", "big", limits, now_ms=NOW + 1).released
    assert [t for t, _ in released] == ["small"]
    assert gate.read("acme", now_ms=NOW + 1).running_units == ONE


def test_borrowing_passes_the_cap_only_as_far_as_the_caller_lends(gate: GateStore) -> None:
    limits = Limits(max_in_flight=1, borrow=True)
    assert [admit(gate, t, limits) for t in "abcd"] == ["run", "held", "held", "held"]
    # A sweep saw two idle slots and an empty queue.
    assert [t for t, _ in gate.end("acme", "", limits, borrow=2, now_ms=NOW).released] == ["b", "c"]
    # b ran beyond the cap: its end, with the queue empty, is replaced by d.
    assert [t for t, _ in gate.end("acme", "b", limits, borrow=1, now_ms=NOW).released] == ["d"]
    # Nobody lends: the cap holds.
    admit(gate, "e", limits)
    assert gate.end("acme", "c", limits, borrow=0, now_ms=NOW).released == []


def test_an_end_within_the_cap_borrows_nothing(gate: GateStore) -> None:
    limits = Limits(max_in_flight=2, borrow=True)
    assert [admit(gate, t, limits) for t in "abcd"] == ["run", "run", "held", "held"]
    # Running 2 of 2: the end frees one slot, refilled within the cap; nothing ran beyond it.
    assert [t for t, _ in gate.end("acme", "a", limits, borrow=1, now_ms=NOW).released] == ["c"]


def test_every_key_of_a_client_shares_its_hash_tag(key_prefix: str) -> None:
    keys = gate_keys(key_prefix, "acme")
    tags = {key[key.index("{") : key.index("}") + 1] for key in keys}
    assert len(keys) == 4 and tags == {"{acme}"}


def test_nothing_lingers_once_a_client_has_nothing_running_or_held(
    gate: GateStore, client: redis.Redis, key_prefix: str
) -> None:
    limits = Limits(max_in_flight=1)
    admit(gate, "a", limits)
    gate.end("acme", "a", limits, now_ms=NOW)
    run, held, msg, state = gate_keys(key_prefix, "acme")
    assert client.exists(run, held, msg) == 0
    assert 0 < client.pttl(state) <= 2 * gate.lease_ms


def test_with_nothing_held_a_sweep_looks_again_when_the_first_lease_runs_out(gate: GateStore) -> None:
    cap = Limits(max_in_flight=1)
    admit(gate, "a", cap)
    admit(gate, "b", cap)
    released = gate.end("acme", "a", cap, now_ms=NOW + 10)  # b is released; say its releaser dies
    assert (released.state, released.due_ms) == ("lease", NOW + 10 + gate.lease_ms + 1)
    assert gate.end("acme", "b", cap, now_ms=NOW + 20).state == "none"


def test_a_workers_snapshot_reads_limits_only_once_some_are_stored(
    client: redis.Redis, key_prefix: str
) -> None:
    from priority_router.store.limit_store import LimitStore, Snapshot

    worker, operator = LimitStore(client, key_prefix, refresh=0), LimitStore(client, key_prefix)
    assert worker.snapshot() == Snapshot()
    operator.set("acme", Limits(max_in_flight=2))
    assert worker.snapshot().of("acme") == Limits(max_in_flight=2)
    operator.set_default(Limits(rate="5/s"))
    assert worker.snapshot().of("anyone") == Limits(rate="5/s")
