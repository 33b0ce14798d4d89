"""doctor counts the slots of the live workers (``inspect stats``), an autoscaled one at its most."""

from __future__ import annotations

from priority_router.ops import doctor


def test_an_autoscaled_worker_counts_at_its_autoscalers_most() -> None:
    stats = {
        "w1@h": {"pool": {"max-concurrency": 2}, "autoscaler": {"max": 6, "min": 2, "current": 2}},
        "w2@h": {"pool": {"max-concurrency": 4}},
    }
    assert doctor._pool_slots(stats, None) == (10, "2 worker(s) answering")
