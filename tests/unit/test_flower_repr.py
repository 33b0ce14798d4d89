from __future__ import annotations

import ast

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
