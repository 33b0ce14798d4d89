"""A real solo worker drains short documents without stalls (integration/solo_loop.py), on
both brokers: kombu's loop would otherwise sleep up to its next timer (about 2 s) on the
acknowledgement of a document it ran inside a turn, and a worker at the router's prefetch
of one gets nothing more from RabbitMQ until that acknowledgement."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

from celery import Celery
from support.celery_versions import skip_without_fast_redelivery
from support.services import fast_redelivery, kill_worker_mid_work, running_worker

HOLD = "workers.hold_document"


def test_a_solo_worker_takes_each_next_document_as_soon_as_the_last_one_ends(
    worker_env: dict[str, str], producer: Callable[[], Celery]
) -> None:
    app = producer()
    sent = [app.send_task(HOLD, ("heavy", f"h{n}", 0.02), headers={"client_id": "heavy"}) for n in range(100)]
    with running_worker(worker_env, "--pool", "solo"):
        runs = sorted((r["started_at"], r["finished_at"]) for r in (s.get(timeout=240) for s in sent))
    gaps = [start - previous_end for (_, previous_end), (start, _) in pairwise(runs)]
    # Without the wake-up most gaps on RabbitMQ are 0.2-2 s; a loaded machine may pause one.
    stalls = sorted(round(g, 2) for g in gaps if g > 0.5)
    assert len(stalls) <= 2, stalls


def test_a_killed_solo_workers_documents_all_run_on_the_next_one(
    worker_env: dict[str, str], producer: Callable[[], Celery]
) -> None:
    """The wake-up moves when the loop polls, never when a document is acknowledged: a solo
    worker SIGKILLed mid-backlog leaves its unacknowledged document to the broker."""
    skip_without_fast_redelivery(worker_env["BROKER_URL"])
    env = dict(worker_env)
    if env["BROKER_URL"].startswith("redis"):
        env["BROKER_TRANSPORT_OPTIONS"] = fast_redelivery(env)
    app = producer()
    sent = [app.send_task(HOLD, ("heavy", f"h{n}", 0.3), headers={"client_id": "heavy"}) for n in range(20)]
    kill_worker_mid_work(env, "--pool", "solo", received=3)
    assert not all(s.ready() for s in sent)
    with running_worker(env, "--pool", "solo") as worker:
        ran = sorted(s.get(timeout=120)["document_id"] for s in sent)
    assert ran == sorted(f"h{n}" for n in range(20)), worker.output()[-3000:]
