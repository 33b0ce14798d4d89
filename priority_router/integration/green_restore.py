"""A gevent or eventlet worker's sweep of a killed worker's documents back into their queues
(Redis broker).

With late acks, which the router sets, a document a worker was running when it was killed
stays in kombu's ``unacked`` hash until a sweep finds it past ``visibility_timeout`` and
puts it back in its queue.  kombu runs that sweep from its event loop's timer, and Celery
runs green pools without that loop (celery/celery#4968): a killed worker's documents then
waited until some worker started, which sweeps once at start.  A router worker on a green
pool runs kombu's own sweep (``celery_internals.restore_unacked``: its lock, its limit, its
throttle) at kombu's own cadence (``unacked_restore_interval`` seconds), as a prefork
worker's loop does.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from . import celery_internals
from .periodic import Periodic


class UnackedSweep(Periodic):
    """A green worker's daemon thread that runs kombu's sweep of unacked documents."""

    doing = "the sweep of killed workers' unacknowledged documents"
    meanwhile = "a killed worker's documents wait until a worker starts"

    def __init__(self, app: Celery) -> None:
        self._app = app
        self._connection: Any = None
        self._channel: Any = None
        super().__init__("priority-router-unacked-sweep", celery_internals.restore_interval(app))

    def step(self) -> bool:
        if self._channel is None:
            self._connection = self._app.connection_for_read()
            # Fail fast: kombu's default_channel would retry a dead broker forever.
            self._connection.ensure_connection(max_retries=1)
            self._channel = self._connection.channel()
        celery_internals.restore_unacked(self._channel)
        return True

    def on_failure(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            connection.release()


def start_unacked_sweep(app: Celery) -> UnackedSweep:
    sweep = UnackedSweep(app)
    sweep.start()
    return sweep
