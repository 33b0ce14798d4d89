from __future__ import annotations

import ast
from typing import Any
from unittest import mock

import fakeredis
from celery import Celery
from celery.events.dispatcher import EventDispatcher
from celery.signals import before_task_publish

from priority_router import PriorityRouter
from priority_router.decision import Decision, Reason
from priority_router.integration.flower import annotate_kwargsrepr

ACME = Decision("acme", -3, 2, Reason.COUNTED)


def test_real_kwargs_stay_first_and_the_text_stays_a_dict() -> None:
    text = annotate_kwargsrepr("{'document_id': 'd1', 'pages': 3}", ACME)
    assert ast.literal_eval(text) == {
        "document_id": "d1",
        "pages": 3,
        "priority_router_client": "acme",
        "priority_router_priority": 2,
        "priority_router_pending": -3,
    }
    assert text.startswith("{'document_id': 'd1', 'pages': 3, ")


def test_no_kwargs() -> None:
    text = annotate_kwargsrepr("{}", ACME)
    assert ast.literal_eval(text)["priority_router_client"] == "acme"


def test_a_custom_repr_is_kept_and_the_decision_appended() -> None:
    text = annotate_kwargsrepr("<secret kwargs hidden>", ACME)
    assert text.startswith("<secret kwargs hidden> | {")
    assert "'priority_router_priority': 2" in text


def test_a_republished_message_is_not_annotated_twice() -> None:
    once = annotate_kwargsrepr("{'pages': 3}", ACME)
    assert annotate_kwargsrepr(once, Decision("acme", -3, 2, Reason.INHERITED)) == once


def test_odd_client_ids_stay_a_valid_literal() -> None:
    odd = Decision("a'b\"c\n{}", None, 5, Reason.FAIL_OPEN)
    assert ast.literal_eval(annotate_kwargsrepr("{'x': 1}", odd))["priority_router_client"] == "a'b\"c\n{}"


def test_a_costed_document_shows_its_cost_and_a_unit_one_shows_none() -> None:
    costed = ast.literal_eval(annotate_kwargsrepr("{}", Decision("acme", -30.5, 9, Reason.COUNTED, cost=2.5)))
    assert costed["priority_router_cost"] == 2.5 and costed["priority_router_pending"] == -30.5
    assert "priority_router_cost" not in annotate_kwargsrepr("{}", ACME)


def test_a_document_priced_during_an_outage_says_so_and_a_counted_one_says_nothing() -> None:
    local = ast.literal_eval(annotate_kwargsrepr("{}", Decision("acme", -3, 2, Reason.LOCAL)))
    assert (local["priority_router_reason"], local["priority_router_pending"]) == ("local", -3)
    assert "priority_router_reason" not in annotate_kwargsrepr("{}", ACME)


def test_the_task_sent_event_carries_the_decision_as_the_message_does() -> None:
    """Flower applies a task-sent event that arrives after task-received over it: with
    Celery's own kwargs in that event, the decision vanished from Flower's views."""
    app = Celery("unit", broker="memory://", set_as_current=False)
    app.conf.task_send_sent_event = True
    PriorityRouter(redis_client=fakeredis.FakeRedis()).install(app)
    published: list[dict[str, Any]] = []
    sent: list[dict[str, Any]] = []

    def on_publish(headers: dict[str, Any], **_: Any) -> None:
        published.append(dict(headers))

    before_task_publish.connect(on_publish, weak=False)
    try:
        with mock.patch.object(
            EventDispatcher, "publish", lambda self, kind, event, *a, **k: sent.append(event)
        ):
            app.send_task("doc", kwargs={"pages": 3}, headers={"client_id": "acme"})
    finally:
        before_task_publish.disconnect(on_publish)
        app.close()
    (event,) = sent
    assert event["kwargs"] == published[0]["kwargsrepr"]
    assert ast.literal_eval(event["kwargs"])["priority_router_client"] == "acme"
