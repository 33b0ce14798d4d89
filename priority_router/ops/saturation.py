"""When the threshold table runs out: clients sharing its last row.

Past the table's lowest limit every client gets the same, least urgent, priority, and
those clients are served first in first out among themselves: a client with 60 documents
behind one with 1,000 waits for all of them (issue #30).  ``status`` and ``doctor`` say
so, with the fix.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..thresholds import Policy, table_name

#: The command that fits a table to a trace of the user's traffic (docs/simulate.md).
TUNE = "`priority-router simulate TRACE --tune`"


@dataclass(frozen=True)
class Saturation:
    """Clients whose count is under the table's lowest limit, and what they have counted."""

    clients: tuple[str, ...]
    #: Their documents counted (in the spell, or in flight): 1 - pending each, in costs.
    documents: float
    limit: int
    priority: int


def saturation(policy: Policy, counts: Iterable[tuple[str, float]]) -> Saturation | None:
    """The clients of ``counts`` (client id, pending) past ``policy``'s last row, when two
    or more are: None when one client or none is there (alone, it competes with nobody)."""
    last = policy.thresholds[0]
    past = sorted((client, pending) for client, pending in counts if int(pending) < last.below)
    if len(past) < 2:
        return None
    documents = sum(1 - pending for _, pending in past)
    return Saturation(tuple(c for c, _ in past), documents, last.below, last.priority)


def describe(found: Saturation, policy: Policy, mode: str) -> tuple[str, str]:
    """(what is wrong, the fix), worded for status and doctor."""
    counted = (
        "in flight"
        if mode == "inflight"
        else "counted in their busy spells (counted, not necessarily still waiting: the seed count "
        "does not fall as documents finish)"
    )
    shown = ", ".join(found.clients[:5]) + (
        f" and {len(found.clients) - 5} more" if len(found.clients) > 5 else ""
    )
    problem = (
        f"{len(found.clients)} clients ({shown}) share the table's last row (pending < {found.limit}, "
        f"priority {found.priority}) with {found.documents:,.0f} documents {counted}: while they "
        "send, their documents are served first in first out among themselves, so a smaller "
        "client's wait behind a larger one's"
    )
    if table_name(policy) == "wide":
        fix = (
            f"the wide table is in use: fit a deeper one to your traffic with {TUNE}, or give the "
            "largest clients a tier (`priority-router tier set CLIENT --weight W`)"
        )
    else:
        fix = (
            'use the deeper table: thresholds="wide" (PRIORITY_ROUTER_THRESHOLDS=wide, the Celery setting '
            'priority_router_thresholds="wide"); `priority-router simulate TRACE --thresholds wide` '
            f"shows what it does to your traffic, and {TUNE} fits a table to it"
        )
    return problem, fix
