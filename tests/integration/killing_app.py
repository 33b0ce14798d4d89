"""``workers.app`` whose gate stops at one step, to test what each step leaves: the first time
a worker reaches the step named by ``GATE_STEP`` (below), it does ``GATE_DO`` there: ``kill``
(SIGKILL itself), ``flush`` (empty the counter store, as a restart without persistence
does) or ``pause`` (the counter store stops answering for 1.5 s).  A key in
``RUNS_REDIS_URL`` makes it happen once across workers.

Steps: ``hold:counted`` (counted held, not yet in its holding queue), ``hold:queued`` (in
its holding queue, the original not yet acknowledged), ``release:taken`` (taken from the
holding queue with its slot reserved, not yet published), ``release:published`` (published,
not yet marked sent), ``release:marked`` (marked sent, the held copy not yet acknowledged),
``end:ended`` (a document's end counted, nothing released yet), ``adopt:published`` (a
document an older release held in the counter store published to the broker, not yet
forgotten there; at the ``GATE_NTH``-th one, 1 by default); and, on a Redis broker,
``fetch:taken`` (a document taken from its queue by the worker's fetch, not yet delivered
to kombu's consumer, which records it in kombu's ``unacked`` hash).
"""

from __future__ import annotations

import os
import signal
from typing import Any

import redis
from kombu.transport import virtual

from priority_router.integration import holding
from priority_router.router import installed_router
from priority_router.store import gate as store_gate
from priority_router.store import old_held
from workers.app import app

__all__ = ["app"]

STEP = os.environ.get("GATE_STEP", "")
DO = os.environ.get("GATE_DO", "kill")
NTH = int(os.environ.get("GATE_NTH", "1"))
_reached: dict[str, int] = {}


def _at(step: str) -> None:
    if step != STEP:
        return
    _reached[step] = _reached.get(step, 0) + 1
    if _reached[step] < NTH:
        return
    runs = redis.Redis.from_url(os.environ["RUNS_REDIS_URL"])
    if not runs.set(f"{os.environ['RUNS_KEY']}:stopped", step, nx=True):
        return
    if DO == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    router = installed_router(app)
    assert router is not None
    store = redis.Redis.from_url(router.config.redis_url)
    if DO == "flush":
        store.flushall()
    elif DO == "pause":
        store.execute_command("CLIENT", "PAUSE", 1500)
    runs.set(f"{os.environ['RUNS_KEY']}:done", step)


def _around(owner: Any, name: str, before: str, after: str, when: Any = lambda args, result: True) -> None:
    original = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if before:
            _at(before)
        result = original(*args, **kwargs)
        if after and when(args, result):
            _at(after)
        return result

    setattr(owner, name, wrapped)


_around(holding.Holding, "hold", "hold:counted", "hold:queued")
_around(store_gate.GateStore, "take", "", "release:taken", lambda _, v: v.outcome in ("run", "borrowed"))
_around(holding.Held, "send", "", "release:published")
_around(store_gate.GateStore, "sent", "", "release:marked")
_around(store_gate.GateStore, "end", "", "end:ended", lambda args, _: bool(args[2]))
_around(virtual.Transport, "_deliver", "fetch:taken", "")
_around(old_held.OldHeld, "done", "adopt:published", "")
