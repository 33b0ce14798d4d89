"""Anti-starvation (``max_wait``): documents that waited too long are served first.

A client's priority only says which documents go first; under a steady stream of urgent
documents, a busy client's less urgent ones would wait as long as the stream lasts.  With
``max_wait`` set, each worker runs a :class:`Sweeper`: a daemon thread that, every
``max_wait / 4`` seconds (0.05 s to 1 s), runs ``lua/promote.lua`` on every queue the
worker consumes.  The script moves each message published more than ``max_wait`` seconds
ago (its ``priority_router_published_at`` header, against Redis's clock) from its
priority list to the queue's first list, oldest first, in one atomic step: it is served
next, whatever its priority, without being lost or copied, however many workers sweep.

Redis only: RabbitMQ has no sound way to do this (see :data:`AMQP_REFUSAL`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from celery.signals import worker_shutdown

from .. import headers as H
from .celery_internals import priority_list
from .periodic import Periodic

logger = logging.getLogger("priority_router")

#: The promotion script; its KEYS and ARGV are documented at its top.
SCRIPT = (Path(__file__).parent / "lua" / "promote.lua").read_text()

#: Most messages one script call moves: bounds how long one call holds Redis (a sweep
#: calls again while a call moves this many).
BATCH = 200
#: Most calls per queue per sweep (BATCH * MAX_CALLS messages): the rest waits one interval.
MAX_CALLS = 50

#: Why ``max_wait`` is refused on RabbitMQ, said in the ConfigurationError.
AMQP_REFUSAL = (
    "RabbitMQ offers no sound way to serve a document that waited too long before fresher, "
    "more urgent ones: a priority queue always delivers its highest priority first, a "
    "message's priority cannot be changed once it is queued, and per-message TTL with "
    "dead-lettering (the usual re-queue trick) only expires messages that reached the head "
    "of the queue (RabbitMQ's TTL and priority guides), so a low-priority document behind a "
    "stream of urgent ones never expires and is never promoted; re-ordering in the worker "
    "instead would hold messages unacknowledged outside RabbitMQ, against prefetch 1 and "
    "late acks"
)
AMQP_FIX = (
    "use a Redis broker (redis://, rediss://, sentinel://) for max_wait, or leave max_wait "
    "unset on RabbitMQ and bound waits with gentler thresholds (a Policy whose lowest "
    "priorities start later)"
)


def sweep_interval(max_wait: float) -> float:
    """Seconds between a worker's sweeps: a quarter of ``max_wait``, within 0.05..1 s."""
    return min(1.0, max(0.05, max_wait / 4))


def queue_lists(channel: Any, queue: str) -> list[str]:
    """The Redis keys of ``queue``'s priority lists on a kombu Redis ``channel``, most urgent
    first: the keys its BRPOP polls (``Channel._brpop_start``), with ``global_keyprefix``."""
    names = dict.fromkeys(priority_list(channel, queue, pri) for pri in channel.priority_steps)
    prefix = channel.global_keyprefix or ""
    return [prefix + name for name in names]


class Promoter:
    """Runs the promotion script for one queue's lists on one redis-py client."""

    def __init__(self, client: redis.Redis, max_wait: float, batch: int = BATCH) -> None:
        self.max_wait = max_wait
        self.batch = batch
        self._script = client.register_script(SCRIPT)

    def promote(self, keys: Sequence[str]) -> int:
        """Move every message of ``keys[1:]`` older than ``max_wait`` to ``keys[0]``, oldest
        first (at most ``batch * MAX_CALLS``); how many moved."""
        if len(keys) < 2:
            return 0
        total = 0
        for _ in range(MAX_CALLS):
            moved = int(self._script(keys=list(keys), args=[repr(self.max_wait), self.batch, H.PUBLISHED_AT]))
            total += moved
            if moved < self.batch:
                break
        return total


class Sweeper(Periodic):
    """A worker's daemon thread that promotes its queues' overdue documents."""

    doing = "the max_wait sweep"
    meanwhile = "documents are served by priority alone"

    def __init__(self, app: Celery, max_wait: float, queues: Callable[[], list[str]]) -> None:
        super().__init__("priority-router-sweeper", sweep_interval(max_wait))
        self.app = app
        self.max_wait = max_wait
        self._queues = queues
        self._connection: Any = None
        self._channel: Any = None
        self._promoter: Promoter | None = None
        self.moved = 0

    def step(self) -> bool:
        moved = self.sweep()
        if moved:
            logger.debug("max_wait: %d overdue documents served first", moved)
        return True

    def sweep(self) -> int:
        """One sweep of every queue the worker consumes; how many documents moved."""
        if self._promoter is None:
            # A connection of its own: kombu's channel knows the broker URL, TLS, Sentinel,
            # the priority steps and the key prefix the worker's BRPOP uses.
            self._connection = self.app.connection_for_read()
            # Fail fast: kombu's default_channel would retry a dead broker forever.
            self._connection.ensure_connection(max_retries=1)
            self._channel = self._connection.channel()
            client = redis.Redis(connection_pool=self._channel.pool)
            self._promoter = Promoter(client, self.max_wait)
        moved = 0
        for queue in self._queues():
            moved += self._promoter.promote(queue_lists(self._channel, queue))
        self.moved += moved
        return moved

    def on_failure(self) -> None:
        connection, self._connection = self._connection, None
        channel, self._channel = self._channel, None
        self._promoter = None
        close_quietly(connection, channel, "the sweeper's")


def consumed_queues(consumer: Any) -> Callable[[], list[str]]:
    """The names of the queues a worker's ``consumer`` takes tasks from, read at each sweep
    (queues added or cancelled with remote control included)."""

    def names() -> list[str]:
        task_consumer = getattr(consumer, "task_consumer", None)
        if task_consumer is not None:
            return [q.name for q in task_consumer.queues]
        return list(consumer.app.amqp.queues.consume_from)

    return names


def start_sweeper(app: Celery, consumer: Any, max_wait: float) -> Sweeper:
    """Start sweeping the queues ``consumer`` takes from; it stops with the worker."""
    sweeper = Sweeper(app, max_wait, consumed_queues(consumer))
    uid = f"priority_router:sweeper:{id(sweeper)}"

    def on_shutdown(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", app) is not app:
            return
        worker_shutdown.disconnect(dispatch_uid=uid)
        sweeper.stop()

    worker_shutdown.connect(on_shutdown, weak=False, dispatch_uid=uid)
    sweeper.start()
    logger.info(
        "priority-router: documents waiting over %g s are served first (swept every %.2f s)",
        max_wait,
        sweeper.interval,
    )
    return sweeper


def close_quietly(connection: Any, channel: Any, whose: str) -> None:
    """Close a broker ``connection`` (and its ``channel``) a background thread opened; a
    failure to close one that already broke is logged at DEBUG, never raised."""
    if connection is None:
        return
    try:
        if channel is not None:
            channel.close()
        connection.close()
    except Exception:
        logger.debug("closing %s connection failed", whose, exc_info=True)
