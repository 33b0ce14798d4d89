"""The Celery worker internals the gate uses (integration/worker_state.py), against the
installed Celery: each test fails when Celery changes what the gate relies on."""

from __future__ import annotations

from unittest import mock

import pytest
from celery import Celery
from celery.worker import state
from celery.worker.request import Request
from kombu.message import Message

from priority_router.integration import worker_state


def _request(app: Celery) -> Request:
    message = Message(
        body=b"[[], {}, {}]",
        content_type="application/json",
        content_encoding="utf-8",
        headers={"id": "t-1", "task": "doc", "lang": "py", "client_id": "acme"},
        delivery_info={"exchange": "", "routing_key": "documents"},
        properties={"priority": 9},
        channel=mock.Mock(),
    )
    message.delivery_tag = 1
    return Request(message, app=app, task=app.tasks["doc"])


def _doc() -> None:
    pass


@pytest.fixture
def app() -> Celery:
    app = Celery("state", set_as_current=False)
    app.task(name="doc")(_doc)
    return app


def test_a_reserved_request_is_held_until_forgotten(app: Celery) -> None:
    request = _request(app)
    state.task_reserved(request)  # what Celery's strategy does on receipt
    try:
        assert request in worker_state.held_requests()
        assert worker_state.held_count() >= 1
        worker_state.forget(request)
        assert request not in worker_state.held_requests()
        assert request.id not in state.requests
    finally:
        state.task_ready(request)


def test_acknowledge_now_acks_the_message_once_and_celery_does_not_again(app: Celery) -> None:
    request = _request(app)
    on_ack = mock.Mock()
    request._on_ack = on_ack  # Celery's queued ack, which must not run
    worker_state.acknowledge_now(request)
    request.message.channel.basic_ack.assert_called_once_with(1, multiple=False)
    assert request.acknowledged
    request.acknowledge()  # Celery's own ack after the gate's: a no-op
    on_ack.assert_not_called()
    worker_state.acknowledge_now(request)
    request.message.channel.basic_ack.assert_called_once()


def test_a_request_exposes_its_message_and_headers(app: Celery) -> None:
    request = _request(app)
    assert request.message.headers["client_id"] == "acme"
    assert request.request_dict["client_id"] == "acme"
    request.request_dict["priority_router_gated"] = True  # what the gate marks for the end
    assert request.request_dict["priority_router_gated"] is True
