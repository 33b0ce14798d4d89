"""One document ahead for a prefork worker on RabbitMQ, while its documents are short.

At the router's prefetch multiplier of 1 with late acks, a worker's prefetch window is its
pool's size, and every document in it is running.  RabbitMQ sends the next document only
once the ack of one that ended has reached it, so each slot idles for that round trip, and
a prefork worker's main process, which acks, dispatches and reads results for every slot,
adds its own turn: with 20 ms documents on ``-P prefork -c 4``, 0.88x plain Celery's
throughput; with the window one above the pool's size, 0.98x (docs/performance.md, "Short
documents").

That document ahead costs a light client's document the time one slot takes to free: a
few milliseconds for short documents, but with 1 s documents the light clients' p95 wait
rose from 2.0 s to 3.0 s (docs/performance.md, rerun 2026-12-03).  So the window widens
only while the worker's documents are short: when it receives documents faster than one
slot-length per :data:`SHORT` seconds (its pool's size in receipts within that time,
counted over the last receipts), and narrows again past twice that.  An idle worker
keeps what it had; a burst of long documents narrows it after a pool's worth of them.

Only where that was measured to pay: on the Redis broker the same extra document did not
(its gap is kombu's acknowledgement, a blocking round trip in the main process, which no
window removes), and a window the user chose is theirs.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

from celery import Celery, bootsteps
from celery.signals import task_received

from . import celery_internals
from .brokers import Transport
from .installation import installation_of
from .pools import WorkerPool

#: Seconds: documents shorter than this (estimated from the receipts) get one ahead.
SHORT = 0.1


def widens(transport: Transport | None, pool: WorkerPool | None, multiplier: object) -> bool:
    """Whether a worker of ``pool`` on ``transport`` at prefetch ``multiplier`` may take a
    document ahead: a prefork pool on RabbitMQ at the router's multiplier 1."""
    return transport is Transport.AMQP and pool is not None and pool.name == "prefork" and multiplier == 1


class ShortDocuments:
    """A consumer's window, one wider while its documents are short.

    At each receipt it estimates how long a document holds a slot: the time the last
    ``slots`` receipts took (a saturated pool receives one document per document that
    ends).  The first ``slots`` receipts of a start arrive at once, to fill the window,
    so nothing is decided before ``2 * slots + 1`` receipts."""

    def __init__(self, consumer: Any, slots: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._consumer = consumer
        self._slots = slots
        self._clock = clock
        self._needed = 2 * slots + 1
        self._receipts: collections.deque[float] = collections.deque(maxlen=self._needed)
        self.wide = False

    def received(self) -> None:
        self._receipts.append(self._clock())
        if len(self._receipts) < self._needed:
            return
        span = self._receipts[-1] - self._receipts[-1 - self._slots]
        # The state changes before the broker is told: telling it waits for its reply, and
        # the receipts that arrive meanwhile come back here.
        if not self.wide and span < SHORT:
            self.wide = True
            self.wide = celery_internals.resize_prefetch(self._consumer, 1)
        elif self.wide and span > 2 * SHORT:
            self.wide = False
            celery_internals.resize_prefetch(self._consumer, -1)


def watch_window(app: Celery) -> None:
    """Add :class:`WindowStep` to ``app``'s workers (idempotent)."""
    app.steps["consumer"].add(WindowStep)


class WindowStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """A consumer bootstep: after the task consumer sets its window (at each start, also
    after a lost connection, which rebuilds it), follow the worker's documents with a
    :class:`ShortDocuments` where :func:`widens` says."""

    name = "priority_router.window"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.window: ShortDocuments | None = None

    def start(self, parent: Any) -> None:
        self.window = None
        installation = installation_of(parent.app)
        if installation is None or installation.engine.config.dry_run:
            return
        multiplier = getattr(parent, "prefetch_multiplier", None)
        slots = getattr(parent, "initial_prefetch_count", 0) or 0
        if slots and widens(installation.receiver.transport, installation.pool, multiplier):
            self.window = ShortDocuments(parent, slots)
            task_received.connect(self._received, sender=parent, weak=False)

    def stop(self, parent: Any) -> None:
        task_received.disconnect(self._received, sender=parent)
        self.window = None

    def _received(self, **_: Any) -> None:
        if self.window is not None:
            self.window.received()
