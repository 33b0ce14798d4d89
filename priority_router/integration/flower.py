"""Showing the router's decision in Flower through the message's ``kwargsrepr``.

Flower builds its task views and search index from worker events, and the
``task-received`` event carries only the protocol 2 ``argsrepr``/``kwargsrepr``
headers, never custom headers.  Those two headers are Celery's supported way to
change what monitors display (they exist to hide secrets) and they do not touch the
arguments the task runs with.  So the router appends its decision to ``kwargsrepr``
as extra, namespaced keys:

    {'document_id': 'd1', 'pages': 3, 'priority_router_client': 'acme',
     'priority_router_priority': 1, 'priority_router_pending': 0}

The real keyword arguments stay in front, unchanged, and the text stays a dict
literal, so Flower's exact search ``kwargs:priority_router_client=acme`` finds
every document of a client, including those whose id travelled only in a header.
A document priced while the counter store failed, by the publishing process's own count
(``docs/failure.md``), adds ``'priority_router_reason': 'local'``.
A router in dry run adds ``'priority_router_dry_run': True``, since Flower cannot see
the header that says so, and a router with a table other than the scheme's names it
(``'priority_router_thresholds': 'wide'``) on every counted document.

A document the worker's gate holds (``gate.py``) is announced again as received, its
``kwargs`` ending with why it waits (``'priority_router_held': "held by its client's
cap: max_in_flight=3 running"``); Flower shows it RECEIVED with the reason until it is
released, received once more and started.  (A custom event state would be kept by
Flower's state machine over every later state but success and failure.)
"""

from __future__ import annotations

import re
from typing import Any

from ..decision import Decision, Reason

CLIENT_KEY = "priority_router_client"
PRIORITY_KEY = "priority_router_priority"
PENDING_KEY = "priority_router_pending"
DRY_RUN_KEY = "priority_router_dry_run"
TIER_KEY = "priority_router_tier"
COST_KEY = "priority_router_cost"
HELD_KEY = "priority_router_held"
TABLE_KEY = "priority_router_thresholds"
REASON_KEY = "priority_router_reason"
#: Longer ids are shown cut (headers must stay small; see publish.MAX_HEADER_ID).
MAX_SHOWN_ID = 200


def annotate_kwargsrepr(
    kwargsrepr: str, decision: Decision, dry_run: bool = False, table: str | None = None
) -> str:
    """``kwargsrepr`` with the decision added; an unusual repr gets it appended.  ``table``
    names the threshold table when it is not the scheme's (``wide``, or its rows)."""
    client = decision.client_id
    if client is not None and len(client) > MAX_SHOWN_ID:
        client = client[:MAX_SHOWN_ID] + "..."
    extra = (
        f"{CLIENT_KEY!r}: {client!r}, {PRIORITY_KEY!r}: {decision.priority!r}, "
        f"{PENDING_KEY!r}: {decision.pending!r}"
    )
    if decision.tier is not None:
        extra += f", {TIER_KEY!r}: {decision.tier!r}"
    if decision.cost != 1:
        extra += f", {COST_KEY!r}: {decision.cost!r}"
    if decision.reason is Reason.LOCAL:
        extra += f", {REASON_KEY!r}: {decision.reason.value!r}"
    if table is not None and decision.pending is not None:
        extra += f", {TABLE_KEY!r}: {table!r}"
    if dry_run:
        extra += f", {DRY_RUN_KEY!r}: True"
    text = kwargsrepr.strip()
    # A republished message (retry, or a re-sent copy) keeps the first annotation.
    return kwargsrepr if CLIENT_KEY in text else _added(text, extra, kwargsrepr)


def annotate_held(kwargsrepr: object, reason: str) -> str:
    """``kwargsrepr`` with why the gate holds the document."""
    text = kwargsrepr.strip() if isinstance(kwargsrepr, str) else "{}"
    return _added(text, f"{HELD_KEY!r}: {reason!r}", text)


def _added(text: str, extra: str, whole: str) -> str:
    """``extra`` keys inside the dict literal ``text``; after ``whole`` (a user's own
    kwargsrepr, say one that hides secrets, or a truncated one) when it is none."""
    if text in ("", "{}"):
        return "{" + extra + "}"
    if text.startswith("{") and text.endswith("}"):
        return text[:-1] + ", " + extra + "}"
    return f"{whole} | {{{extra}}}"


_SHOWN = re.compile(
    r"'priority_router_(held|client|priority|pending|tier|reason)': "
    r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|-?\d+|None)"
)


def format_task(task: Any) -> Any:
    """Flower's ``format_task`` hook: the decision first in the task's ``kwargs`` text.

    Flower's task list cuts the ``kwargs`` cell at 400 px, where the router's keys come
    after the task's own arguments.  Name it in ``flowerconfig.py``
    (``from priority_router.integration.flower import format_task``); it changes only what
    the pages show, not Flower's search or API."""
    text = getattr(task, "kwargs", None)
    if not isinstance(text, str):
        return task
    shown = _SHOWN.findall(text)
    if shown:
        task.kwargs = " ".join(f"{key}={value}" for key, value in shown) + " | " + text
    return task
