"""Names of the message headers that carry the router's decision downstream."""

from __future__ import annotations

#: Logical priority (1 most urgent .. 9) given to the document.
PRIORITY = "priority_router_priority"
#: The client's pending count at the check (None when it was not counted).
PENDING = "priority_router_pending"
#: How the priority was decided: counted, inherited, default, fail-open, no-client, not-counted.
REASON = "priority_router_reason"
#: Publish time (Unix seconds) for measuring queue wait on the worker.
PUBLISHED_AT = "priority_router_published_at"
#: Present (True) when the router ran in dry run: the decision was made and counted,
#: but the message's broker priority is the one plain Celery gave it.
DRY_RUN = "priority_router_dry_run"
#: Present (True) on a document counted in ``mode="inflight"`` (a retry copies it): the
#: worker ends it when it finishes.
INFLIGHT = "priority_router_inflight"
#: What the document counted (a positive number; absent: 1).  Set it on a publish to
#: count a document by its pages, size or expected seconds; the worker's end in
#: ``mode="inflight"`` gives back the cost this header carries.
COST = "priority_router_cost"
#: The tier that adjusted the priority, as ``"client: weight=2 shift=-1"`` or
#: ``"default: fixed=9"``; absent when the threshold table alone decided.
TIER = "priority_router_tier"
#: Present (True) on a document the worker's gate admitted under its client's limits: its
#: end frees the client's slot (``integration/gate.py``).  Set by the worker, never sent.
GATED = "priority_router_gated"
