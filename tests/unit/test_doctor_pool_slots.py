"""doctor: the slots of the live workers (``inspect stats``), an autoscaled one at its most; the
fix it names when a check cannot run."""

from __future__ import annotations

from collections.abc import Iterator
from unittest import mock

import pytest
import redis
from celery import Celery

from priority_router.integration.pools import pool_named
from priority_router.ops import doctor


def test_an_autoscaled_worker_counts_at_its_autoscalers_most() -> None:
    stats = {
        "w1@h": {"pool": {"max-concurrency": 2}, "autoscaler": {"max": 6, "min": 2, "current": 2}},
        "w2@h": {"pool": {"max-concurrency": 4}},
    }
    assert doctor._pool_slots(stats, None) == (10, "2 worker(s) answering")


def test_an_autoscaled_worker_is_checked_for_its_autoscalers_range() -> None:
    """Its pool section reports the current size (1 when idle), which the pool line showed
    while the limits line counted the most (a Django trial's --autoscale=4,1)."""
    stats = {
        "w1@h": {
            "pool": {"implementation": "celery.concurrency.prefork:TaskPool", "max-concurrency": 1},
            "autoscaler": {"max": 4, "min": 1, "current": 1, "qty": 0},
        }
    }
    pool, said = doctor._pool_to_check(Celery("t", broker="memory://", set_as_current=False), stats)
    assert (pool.concurrency, pool.fewest) == (4, 1)
    assert said.detail == "prefork pool, autoscaled from 1 to 4, as the 1 worker(s) answering run"


def test_only_the_workers_consuming_the_apps_queues_are_asked_about_their_pool() -> None:
    """Another app's workers on the same broker answer the broadcast too (a cluster trial's
    doctor took a test suite's 2-slot worker for its own 4-slot ones)."""
    app = Celery("t", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = "docs"
    inspect = mock.Mock()
    inspect.stats.return_value = {
        "ours@h": {"pool": {"implementation": "celery.concurrency.prefork:TaskPool", "max-concurrency": 4}},
        "theirs@h": {"pool": {"implementation": "celery.concurrency.prefork:TaskPool", "max-concurrency": 2}},
    }
    inspect.active_queues.return_value = {"ours@h": [{"name": "docs"}], "theirs@h": [{"name": "other"}]}
    with mock.patch.object(app.control, "inspect", return_value=inspect):
        stats = doctor._worker_stats(app)
    assert list(stats) == ["ours@h"]
    pool, _ = doctor._pool_to_check(app, stats)
    assert pool.concurrency == 4


def test_a_check_stopped_by_a_redis_user_without_channels_names_the_acl_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Celery's remote control publishes on Redis channels, which a Redis 7 ACL user lacks
    by default; doctor's workers check then says which permission to grant."""

    def denied(app: Celery, queues: object) -> None:
        raise redis.exceptions.NoPermissionError(
            "this user has no permissions to access one of the channels used as arguments"
        )

    def broken(app: Celery, transport: object) -> Iterator[doctor.Finding]:
        raise RuntimeError("something else")
        yield

    # The workers check's broadcast is refused (what Celery's inspect raises then).
    monkeypatch.setattr(doctor, "consumers", denied)
    monkeypatch.setattr(doctor, "_CHECKS", {"workers": doctor._check_consumers, "other": broken})
    app = Celery("acl", broker="redis://127.0.0.1:6379/15")
    found = {f.check: f for f in doctor.diagnose(app, pool_named("threads", 4))}
    assert not found["workers"].ok and "&*" in found["workers"].fix
    assert found["other"].fix == "fix what stops the check"
