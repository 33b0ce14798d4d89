"""What the router does with a kombu older than 5.7 (Celery 5.5 pins kombu below 5.6).

kombu 5.7 changed two things a worker's priorities rely on:

- A thread pool's finished task wakes the worker's event loop.  Before it, a threads
  worker at the router's prefetch of 1 starts its next document only when its loop wakes
  on its own, about once a second (20 documents of 50 ms on 2 threads: 12-18 s instead of
  under 1 s, on Redis and on RabbitMQ alike).  On
  such a worker :class:`WakeStep` wakes the loop every :data:`WAKE` seconds with a timer
  that does nothing: the loop then sees the freed prefetch slot and polls the broker, so
  a document waits at most about :data:`WAKE` s for its slot.
- ``unacked_restore_interval`` and ``unacked_restore_throttle`` (Redis): before 5.7 kombu looks
  for a dead worker's unacknowledged documents every 10 s but scans every tenth time,
  about every 100 s, whatever those options say.  Not worked around: such documents come
  back up to about 100 s after ``visibility_timeout``.

A worker says so once at start (:func:`shortfalls`), and ``doctor`` reports it.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import kombu
from celery import Celery, bootsteps

from .brokers import Transport
from .installation import installation_of
from .pools import WorkerPool

logger = logging.getLogger("priority_router")

#: The kombu release whose behaviour the router is built for.
FULL = (5, 7)
#: Seconds between the wake-ups of a threads worker's loop on an older kombu.
WAKE = 0.05
#: What to install for the full behaviour.
FIX = "pip install 'kombu>=5.7' (with Celery 5.4, or 5.6 and later: Celery 5.5 pins kombu<5.6)"


def kombu_version(version: str | None = None) -> tuple[int, int]:
    """The installed kombu's (major, minor), or ``version``'s."""
    major, minor = (int(p) for p in re.findall(r"\d+", version or kombu.__version__)[:2])
    return major, minor


def wakes_loop(transport: Transport | None, pool: WorkerPool | None, version: str | None = None) -> bool:
    """Whether the router wakes the worker's loop itself: a threads worker with a kombu
    before 5.7, on either broker."""
    old = kombu_version(version) < FULL
    return old and transport is not None and pool is not None and pool.name == "threads"


def shortfalls(transport: Transport | None, pool: WorkerPool | None, version: str | None = None) -> list[str]:
    """What this kombu lacks for a worker of ``pool`` on ``transport``, and what the router
    does instead, one sentence each; empty from kombu 5.7 on."""
    if kombu_version(version) >= FULL:
        return []
    said = []
    if wakes_loop(transport, pool, version):
        said.append(
            "a threads worker's finished task does not wake its event loop, so the router wakes "
            f"it every {WAKE:g} s (without that, about one document a second)"
        )
    if transport is Transport.REDIS:
        said.append(
            "a dead worker's unacknowledged documents come back about every 100 s after "
            "visibility_timeout, whatever unacked_restore_interval and unacked_restore_throttle say"
        )
    return said


def watch_old_kombu(app: Celery) -> None:
    """On a kombu before 5.7, add :class:`WakeStep` to ``app``'s workers (idempotent)."""
    if kombu_version() < FULL:
        app.steps["consumer"].add(WakeStep)


class WakeStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """A consumer bootstep: a threads worker's event loop wakes every :data:`WAKE` s."""

    name = "priority_router.wake"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.timer: Any = None

    def start(self, parent: Any) -> None:
        hub = getattr(parent, "hub", None)
        installation = installation_of(parent.app)
        if hub is None or installation is None or installation.engine.config.dry_run:
            return
        if not wakes_loop(installation.receiver.transport, installation.pool):
            return
        # The hub polls no longer than its next timer: this one makes that WAKE seconds.
        self.timer = hub.call_repeatedly(WAKE, _nothing)

    def stop(self, parent: Any) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def _nothing() -> None:
    """The wake-up: the loop's next turn polls the broker again when a slot is free."""
