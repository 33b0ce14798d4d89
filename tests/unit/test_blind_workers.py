"""The blind-worker check judges only workers whose settings it read (integration/consumers.py)."""

from __future__ import annotations

from typing import Any
from unittest import mock

from celery import Celery

from priority_router.integration.brokers import Transport
from priority_router.integration.consumers import blind_workers


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
