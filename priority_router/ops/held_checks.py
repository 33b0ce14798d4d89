"""doctor's checks of where held documents wait, across releases (docs/lifecycle.md):
documents an older release's workers hold in the counter store, and holding queues on the
broker with documents the store does not count (a worker of an older release, rolled back
to, zeroed the count)."""

from __future__ import annotations

import time

from celery import Celery

from ..integration.holding import Holding
from ..limits import Limits
from ..router import PriorityRouter, engine_of
from ..store.old_held import OldHeld, describe_old_held

#: Most clients whose holding queue doctor sizes (one passive declare each).
MOST_CLIENTS = 200
#: Seconds before a client whose holding queue outnumbers its held count is looked at again:
#: a hold counts before it publishes, a release publishes after it counts, so a gap that
#: lasts is no hold or release under way.
RECHECK = 1.0

UNCOUNTED_FIX = (
    "start a worker of this release: it counts them again and releases them as the limits allow. "
    "Before rolling workers back to a release that held documents in the counter store, lift the "
    "limits (priority-router tier unset CLIENT) and wait until `priority-router status` shows none "
    "held (docs/lifecycle.md)"
)


def older_release_held(router: PriorityRouter) -> tuple[str, str] | None:
    """The problem and its fix when an older release's workers hold documents in the store."""
    counts = OldHeld(engine_of(router).redis, router.config.key_prefix).counts()
    if not counts:
        return None
    problem, fix = describe_old_held(counts).split(". Fix: ", 1)
    return problem, fix


def uncounted_held(app: Celery, router: PriorityRouter) -> dict[str, tuple[int, int]]:
    """Clients (with limits, or on the store's index of clients holding documents) whose
    holding queue on the broker has more documents than the store counts held: client ->
    (in the holding queue, counted)."""
    engine = engine_of(router)
    limited = [c for c, v in engine.limit_store.all().items() if isinstance(v, Limits) and v]
    clients = list(dict.fromkeys(limited + engine.gate_store.holding()))[:MOST_CLIENTS]
    holding = Holding(app, router.config.key_prefix)
    try:
        found = _gaps(holding, router, clients)
        if found:
            time.sleep(RECHECK)
            found = _gaps(holding, router, list(found))
    finally:
        holding.close()
    return found


def _gaps(holding: Holding, router: PriorityRouter, clients: list[str]) -> dict[str, tuple[int, int]]:
    gaps = {}
    for client in clients:
        queued = holding.count(client)
        if queued:
            counted = router.gate_state(client).held
            if queued > counted:
                gaps[client] = (queued, counted)
    return gaps


def describe_uncounted(gaps: dict[str, tuple[int, int]]) -> str:
    shown = ", ".join(
        f"{client!r} ({queued} in its holding queue, {counted} counted)"
        for client, (queued, counted) in sorted(gaps.items())[:10]
    )
    return (
        f"the holding queues on the broker hold documents the counter store does not count held, of "
        f"{shown}: `priority-router status` shows them as not held, and they wait until a worker of "
        "this release runs (a worker of an older release zeroed the count: a rollback)"
    )
