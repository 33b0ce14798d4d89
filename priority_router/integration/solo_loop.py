"""A solo worker's event loop never sleeps on an acknowledgement it has queued itself.

kombu's loop takes the callbacks queued for its turn, runs them, fires its timers, then
polls its sockets until one is ready or its next timer is due.  Celery queues each
document's acknowledgement on that loop.  A solo pool runs the document inside the loop, so
when the document itself was read by one of those callbacks (kombu's AMQP reader drains the
connection again after each delivery), its acknowledgement is queued after the turn took
its callbacks, and waits for the poll.  With late acks and a prefetch of one, which
priorities need, the broker sends nothing before that acknowledgement, so nothing wakes the
poll until the next timer, up to 2 s later: 20 ms documents on RabbitMQ ran at 0.14x plain
Celery's speed with the router, and about one in ten of plain Celery's, set the same way,
waited 1.6-2 s (docs/performance.md, "Short documents").

:class:`SoloLoopStep` gives such a loop a :class:`Wakeup` of its own: a pipe the loop reads,
written just before the loop polls whenever callbacks are queued for its next turn, so the
poll returns at once and the turn runs them.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from celery import Celery, bootsteps

from . import celery_internals
from .installation import installation_of


def watch_solo_loop(app: Celery) -> None:
    """Add :class:`SoloLoopStep` to ``app``'s workers (idempotent)."""
    app.steps["consumer"].add(SoloLoopStep)


class SoloLoopStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """A consumer bootstep: a solo worker's loop gets a :class:`Wakeup`."""

    name = "priority_router.solo_loop"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.wakeup: Wakeup | None = None

    def start(self, parent: Any) -> None:
        self.stop(parent)  # a consumer restarted after a lost connection starts its steps again
        hub = getattr(parent, "hub", None)
        installation = installation_of(parent.app)
        if hub is None or installation is None or installation.engine.config.dry_run:
            return
        if installation.pool is not None and installation.pool.name == "solo":
            self.wakeup = Wakeup(hub)

    def stop(self, parent: Any) -> None:
        if self.wakeup is not None:
            self.wakeup.close()
            self.wakeup = None


class Wakeup:
    """A pipe that kombu's loop ``hub`` reads, written just before each poll while callbacks
    are queued for the loop's next turn: that poll returns at once."""

    def __init__(self, hub: Any) -> None:
        self._hub = hub
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        hub.add_reader(self._read, self._woken)
        hub.on_tick.add(self._before_poll)

    def close(self) -> None:
        self._hub.on_tick.discard(self._before_poll)
        self._hub.remove_reader(self._read)
        os.close(self._read)
        os.close(self._write)

    def _before_poll(self) -> None:
        if celery_internals.loop_callbacks_queued(self._hub):
            with contextlib.suppress(BlockingIOError):  # a full pipe: the loop is woken already
                os.write(self._write, b"\0")

    def _woken(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._read, 4096)
