"""The workers check judges only workers whose settings it read, and says which it could not
(integration/consumers.py, ops/doctor.py)."""

from __future__ import annotations

from typing import Any
from unittest import mock

from celery import Celery

from priority_router.integration.brokers import Transport
from priority_router.integration.consumers import Consumer, blind_workers, consumers, taking_ahead
from priority_router.ops import doctor


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
    # The busy one did not answer conf in time: its settings are unknown, never guessed.
    assert found is not None and [c.conf for c in found if c.worker == "busy@h"] == [None]
    ahead = taking_ahead(found)
    assert [line.split()[1] for line in ahead] == ["dry@h", "kept@h"]
    assert "worker_prefetch_multiplier=4, task_acks_late=False" in ahead[0]


def test_doctor_says_which_workers_it_could_not_check_instead_of_calling_every_one_fine() -> None:
    app = Celery("t", broker="memory://")
    router_conf = {
        "worker_prefetch_multiplier": 1,
        "task_acks_late": True,
        "broker_transport_options": {"priority_steps": list(range(10))},
    }
    answered = [
        Consumer("busy@h", "docs", {"name": "docs"}, None),
        Consumer("ok@h", "docs", {"name": "docs"}, router_conf),
    ]
    with mock.patch.object(doctor, "consumers", return_value=answered):
        findings = list(doctor._check_consumers(app, Transport.REDIS))
    assert all(f.ok for f in findings)
    assert findings[0].detail.startswith("not checked: busy@h did not give its settings")
    assert findings[1].detail.startswith("every worker else consuming these queues takes every priority")
