"""The blind-worker check judges only workers whose settings it read (integration/consumers.py)."""

from __future__ import annotations

from typing import Any
from unittest import mock

from celery import Celery

from priority_router.integration.brokers import Transport
from priority_router.integration.consumers import blind_workers, consumers, taking_ahead


def _inspect(active: dict[str, Any], conf: dict[str, Any]) -> mock.Mock:
    inspect = mock.Mock()
    inspect.active_queues.return_value = active
    inspect.conf.return_value = conf
    return inspect


def test_a_worker_whose_settings_did_not_answer_in_time_is_not_called_blind() -> None:
    app = Celery("t", broker="memory://")
    active = {"busy@h": [{"name": "docs"}], "plain@h": [{"name": "docs"}]}
    # The busy worker answered active_queues but not conf within the timeout.
    conf = {"plain@h": {"broker_transport_options": {}}}
    with mock.patch.object(app.control, "inspect", return_value=_inspect(active, conf)):
        found = blind_workers(app, Transport.REDIS, {"docs"})
    assert [b.worker for b in found or []] == ["plain@h"]
    assert found is not None and found[0].unseen == (1, 2, 4, 5, 7, 8)


def test_workers_that_take_documents_ahead_are_named_by_their_own_settings() -> None:
    """doctor's prefetch and acks_late lines judge the app as its own process loads it; a
    worker started with other environment variables (a router in dry run there, or none)
    runs Celery's defaults, which only its answer to ``conf`` shows."""
    app = Celery("t", broker="memory://")
    active = {w: [{"name": "docs"}] for w in ("router@h", "green@h", "dry@h", "kept@h", "busy@h")}
    conf = {
        "router@h": {"worker_prefetch_multiplier": 1, "task_acks_late": True},
        "green@h": {"worker_prefetch_multiplier": 0, "task_acks_late": True},
        "dry@h": {},  # Celery's defaults: 4, early acks
        "kept@h": {"worker_prefetch_multiplier": 1, "task_acks_late": False},
    }
    with mock.patch.object(app.control, "inspect", return_value=_inspect(active, conf)):
        found = consumers(app, {"docs"})
    assert found is not None and "busy@h" not in {c.worker for c in found}
    ahead = taking_ahead(found)
    assert [line.split()[1] for line in ahead] == ["dry@h", "kept@h"]
    assert "worker_prefetch_multiplier=4, task_acks_late=False" in ahead[0]
