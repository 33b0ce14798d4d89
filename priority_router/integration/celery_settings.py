"""The Celery settings without which broker priorities silently do nothing.

:func:`wanted_changes` works out what an app's configuration lacks; :func:`apply_changes`
merges it in.  A value the user set themselves is kept (a :class:`Change` marked
``kept``), and :func:`warn_kept` names the setting and what keeping it costs.  In dry
run nothing is applied and :func:`describe` says what would be (the same list
``doctor`` reports).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from celery import Celery
from celery.app.defaults import DEFAULTS
from kombu.transport.redis import PRIORITY_STEPS as KOMBU_PRIORITY_STEPS
from kombu.transport.redis import Channel as KombuRedisChannel

from .brokers import AMQP_MAX_PRIORITY, Transport
from .celery_internals import set_by_user
from .pools import KOMBU_MAX_CONNECTIONS, WorkerPool
from .rabbitmq import declared_queues, is_quorum, uses_quorum_queues

logger = logging.getLogger("priority_router")

#: kombu's Redis transport keeps one list per step; 0..9 gives every logical level its own.
REDIS_PRIORITY_STEPS = list(range(10))

#: What keeping each setting at another value costs (warnings here, findings in ``doctor``).
COSTS = {
    "worker_prefetch_multiplier": "each worker process reserves more messages ahead, "
    "so urgent documents published later wait behind them",
    "green_prefetch": "on a gevent or eventlet pool with the Redis broker, a prefetch window "
    "the running tasks fill stalls the worker for up to 2 s each time it fills (kombu pauses "
    "its BRPOP and the blocking loop is not woken when a late ack frees a slot); 0 lets the "
    "pool itself bound what the worker takes",
    "worker_disable_prefetch": "on a gevent or eventlet pool with the Redis broker, the worker "
    "takes no message while its pool is full, and kombu's blocking loop is not woken when a task "
    "ends, so it stalls for up to 2 s each time its pool fills (the router's prefetch multiplier "
    "of 0 lets the pool itself bound what the worker takes)",
    "max_connections": "on a gevent or eventlet pool, acks beyond kombu's connection limit fail "
    "with MaxConnectionsError (logged CRITICAL) and those documents are delivered and run again",
    "task_acks_late": "a message is acknowledged before it runs, so the worker fetches "
    "(and commits to) the next one early, and a crashed worker loses its document",
    "priority_steps": "logical priorities that share a step are served in arrival order",
    "queue_order_strategy": "queues are polled in another order than their priority",
    "task_queue_max_priority": "RabbitMQ queues declared without x-max-priority >= 10 "
    "ignore or clip message priorities",
    "x-max-priority": "the most urgent levels share its top priority",
    "broker_heartbeat": "on a gevent or eventlet pool with RabbitMQ, AMQP heartbeats make "
    "Celery's green loop take about one message per 0.1 s (about 10 documents a second "
    "whatever the concurrency), and the messages reserved meanwhile run ahead of urgent ones",
}


#: Celery 5.6 added ``worker_disable_prefetch``: before it, the key does nothing.
HAS_DISABLE_PREFETCH = "worker_disable_prefetch" in DEFAULTS

#: What ``worker_disable_prefetch`` does to the multiplier (doctor, the worker's start line).
DISABLED_PREFETCH = "each worker reserves no more documents than its pool runs, whatever the multiplier"


class Where(Enum):
    """Where a setting lives in a Celery app."""

    SETTING = "setting"
    TRANSPORT_OPTION = "broker_transport_options"
    QUEUE_ARGUMENT = "queue argument"


@dataclass(frozen=True)
class Change:
    """One value priorities need, next to the value the app has."""

    where: Where
    key: str
    current: object
    wanted: object
    #: The user chose ``current``: the router keeps it (and names its cost) instead.
    kept: bool = False
    #: The queue whose argument this is (``Where.QUEUE_ARGUMENT`` only).
    queue: str | None = None
    #: The app's settings namespace (Django's ``CELERY``), which its users write keys with.
    namespace: str | None = None

    @property
    def name(self) -> str:
        """The setting as a user writes it: ``broker_transport_options['priority_steps']``,
        ``CELERY_TASK_ACKS_LATE`` in an app configured with ``namespace="CELERY"``."""
        if self.where is Where.QUEUE_ARGUMENT:
            return f"{self.key} of queue {self.queue!r}"
        setting = "broker_transport_options" if self.where is Where.TRANSPORT_OPTION else self.key
        if self.namespace:
            setting = f"{self.namespace}_{setting}".upper()
        return f"{setting}[{self.key!r}]" if self.where is Where.TRANSPORT_OPTION else setting

    @property
    def cost(self) -> str:
        if self.key == "worker_prefetch_multiplier" and self.wanted == 0:
            return COSTS["green_prefetch"]
        return COSTS.get(self.key, "priorities may not take full effect")

    def shown(self, value: object) -> str:
        """``name=value`` as a user would write it."""
        if self.where is Where.QUEUE_ARGUMENT:
            return f"{self.key}={value!r} on queue {self.queue!r}"
        return f"{self.name}={value!r}"

    def __str__(self) -> str:
        current = "none" if self.current is None else repr(self.current)
        return f"{self.shown(self.wanted)} (now {current})"


# -- what the app lacks -----------------------------------------------------------------


def wanted_changes(
    app: Celery,
    transport: Transport,
    pool: WorkerPool | None = None,
    applied: Mapping[str, object] | None = None,
) -> list[Change]:
    """Every value priorities need that ``app`` does not have yet (reads, changes nothing).

    ``pool`` is the worker's pool, when known (``pools.py``: green pools on Redis need
    other values); ``applied`` holds the values the router itself set earlier, which are
    not the user's choice."""
    applied = applied or {}
    green_redis = pool is not None and pool.green and transport is Transport.REDIS
    prefetch = _setting(app, "worker_prefetch_multiplier", 0 if green_redis else 1, applied)
    if prefetch is not None and prefetch.kept and not green_redis and prefetch_disabled(app.conf, transport):
        prefetch = None  # the user's multiplier reserves nothing ahead: Celery's own limit rules
    changes: list[Change | None] = [prefetch, _setting(app, "task_acks_late", True, applied)]
    if transport is Transport.REDIS:
        changes += _redis_options(app)
        if green_redis:
            assert pool is not None
            changes += _redis_connections(app, pool, applied)
            if prefetch_disabled(app.conf, transport):  # only the user turns it on
                changes.append(Change(Where.SETTING, "worker_disable_prefetch", True, False, kept=True))
    elif transport is Transport.AMQP:
        if pool is not None and pool.green:
            changes.append(_setting(app, "broker_heartbeat", 0, applied))
        changes += _amqp_queues(app)
    lacking = [c for c in changes if c is not None]
    namespace = getattr(app, "namespace", None)
    return [replace(c, namespace=namespace) for c in lacking] if namespace else lacking


def prefetch_disabled(conf: Mapping[str, Any], transport: Transport | None) -> bool:
    """Whether Celery's ``worker_disable_prefetch`` (5.6 and later; ``--disable-prefetch``)
    is on and works on ``transport``: a worker then takes a message only while it holds
    fewer than its pool's processes, whatever ``worker_prefetch_multiplier`` says (Celery
    ignores it on other brokers than Redis, and before 5.6 there is no such setting)."""
    return transport is Transport.REDIS and HAS_DISABLE_PREFETCH and bool(conf.get("worker_disable_prefetch"))


def _setting(app: Celery, key: str, wanted: object, applied: Mapping[str, object]) -> Change | None:
    current = app.conf.get(key)
    if current == wanted:
        return None
    ours = key in applied and applied[key] == current
    return Change(Where.SETTING, key, current, wanted, kept=not ours and set_by_user(app.conf, key))


def _redis_connections(app: Celery, pool: WorkerPool, applied: Mapping[str, object]) -> list[Change]:
    options: dict[str, Any] = app.conf.broker_transport_options or {}
    wanted = pool.redis_connections
    current = options.get("max_connections")
    if current is None:
        return [Change(Where.TRANSPORT_OPTION, "max_connections", KOMBU_MAX_CONNECTIONS, wanted)]
    ours = applied.get("max_connections") == current
    if not isinstance(current, int) or current < wanted:
        return [Change(Where.TRANSPORT_OPTION, "max_connections", current, wanted, kept=not ours)]
    return []


def _redis_options(app: Celery) -> list[Change]:
    options: dict[str, Any] = app.conf.broker_transport_options or {}
    defaults = {
        "priority_steps": (REDIS_PRIORITY_STEPS, KOMBU_PRIORITY_STEPS),
        "queue_order_strategy": ("priority", KombuRedisChannel.queue_order_strategy),
    }
    changes = []
    for key, (wanted, kombu_default) in defaults.items():
        if key not in options:
            changes.append(Change(Where.TRANSPORT_OPTION, key, kombu_default, wanted))
            continue
        current = options[key]
        comparable = list(current) if isinstance(current, list | tuple) else current
        if comparable != wanted:
            changes.append(Change(Where.TRANSPORT_OPTION, key, current, wanted, kept=True))
    return changes


def _amqp_queues(app: Celery) -> list[Change]:
    changes = []
    current = app.conf.task_queue_max_priority
    if current is None and not uses_quorum_queues(app):
        # Celery adds it to every queue it builds, also those it creates later by name.
        changes.append(Change(Where.SETTING, "task_queue_max_priority", None, AMQP_MAX_PRIORITY))
    elif current is not None and current < AMQP_MAX_PRIORITY:
        changes.append(
            Change(Where.SETTING, "task_queue_max_priority", current, AMQP_MAX_PRIORITY, kept=True)
        )
    for queue in declared_queues(app):
        # Quorum queues are left alone: RabbitMQ refuses x-max-priority on them.
        if is_quorum(queue):
            continue
        given = (queue.queue_arguments or {}).get("x-max-priority")
        if given is None or given < AMQP_MAX_PRIORITY:
            kept = given is not None
            changes.append(
                Change(Where.QUEUE_ARGUMENT, "x-max-priority", given, AMQP_MAX_PRIORITY, kept, queue.name)
            )
    return changes


# -- applying them ----------------------------------------------------------------------


def apply_changes(app: Celery, changes: list[Change]) -> dict[str, object]:
    """Merge every change not ``kept`` into ``app`` (applying a list twice is harmless);
    returns what was set, by key."""
    options: dict[str, Any] = dict(app.conf.broker_transport_options or {})
    applied: dict[str, object] = {}
    for change in changes:
        if change.kept:
            continue
        applied[change.key] = change.wanted
        if change.where is Where.TRANSPORT_OPTION:
            options[change.key] = change.wanted
        elif change.where is Where.QUEUE_ARGUMENT:
            _set_queue_argument(app, change)
        else:
            _set(app, change)
    if options != (app.conf.broker_transport_options or {}):
        app.conf.broker_transport_options = options
    return applied


def _set(app: Celery, change: Change) -> None:
    app.conf[change.key] = change.wanted
    built = app.amqp.__dict__.get("queues")
    if change.key == "task_queue_max_priority" and built is not None and built.max_priority is None:
        built.max_priority = change.wanted  # queues Celery creates later by name get it too


def _set_queue_argument(app: Celery, change: Change) -> None:
    for queue in declared_queues(app):
        if queue.name == change.queue:
            queue.queue_arguments = {**(queue.queue_arguments or {}), change.key: change.wanted}


# -- saying so --------------------------------------------------------------------------


def first_time(warned: set[str], what: str) -> bool:
    """True the first time ``what`` is to be said for an app: each warning is said once,
    however often the router settles on the app's configuration."""
    if what in warned:
        return False
    warned.add(what)
    return True


def warn_kept(changes: list[Change], warned: set[str]) -> None:
    """One WARNING per value the user chose over the router's, once each (``warned``)."""
    for change in changes:
        if not change.kept or not first_time(warned, change.name):
            continue
        if change.where is Where.QUEUE_ARGUMENT:
            logger.warning(
                "queue %r keeps your x-max-priority=%r (priority-router uses up to %d): %s",
                change.queue,
                change.current,
                change.wanted,
                change.cost,
            )
        else:
            logger.warning(
                "priority-router keeps your %s=%r (it would set %r): %s",
                change.name,
                change.current,
                change.wanted,
                change.cost,
            )


def describe(changes: list[Change]) -> str:
    """What applying ``changes`` would do, in one sentence's worth of text."""
    applied = [str(c) for c in changes if not c.kept]
    kept = [f"{c.shown(c.current)} ({c.cost})" for c in changes if c.kept]
    text = "it would set " + ", ".join(applied) if applied else "it would change no setting"
    if kept:
        text += "; it would keep your " + "; ".join(kept)
    return text
