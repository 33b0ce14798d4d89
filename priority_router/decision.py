"""The result of routing one document."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Reason(str, Enum):
    """How a document's priority was decided: the ``priority_router_reason`` header."""

    #: Counted for its client, priced by the table (and its tier).
    COUNTED = "counted"
    #: The caller set ``priority=`` (per call, on the task, or by a route): kept as given.
    EXPLICIT = "explicit"
    #: Published from inside a task, for the same client or none: the parent's priority.
    INHERITED = "inherited"
    #: No client id: ``default_priority``.
    NO_CLIENT = "no-client"
    #: A task outside ``tasks=``: not counted, and keeps the priority Celery gives it.
    NOT_COUNTED = "not-counted"
    #: The counter store failed (or its breaker is open): priced by the publishing process's
    #: own count of the client's recent documents (``local_counts.py``).
    LOCAL = "local"
    #: The counter store could not count it otherwise (it is another release's, or the
    #: router erred): ``default_priority``.
    FAIL_OPEN = "fail-open"


@dataclass(frozen=True, slots=True)
class Decision:
    """A client's pending count and the logical priority (1 most urgent .. 9) it maps to.

    ``pending`` is None when the count is unknown (no client id, or the counter store
    failed and the default priority was used); with reason ``local``, it is the publishing
    process's own count.
    """

    client_id: str | None
    #: The count the document was checked at: minus the costs counted before it.
    pending: int | float | None
    priority: int
    reason: Reason = Reason.COUNTED
    #: The tier that adjusted the priority (``"client: weight=2"``, ``"default: fixed=9"``),
    #: None when the threshold table alone decided.
    tier: str | None = None
    #: What the document counted (``record(..., cost=)``, the ``priority_router_cost`` header).
    cost: int | float = 1
