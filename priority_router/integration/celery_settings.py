"""The Celery settings without which broker priorities silently do nothing.

They are merged into the user's configuration: a value the user set themselves
is kept, and a warning names the setting and what keeping it costs.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery

from .brokers import AMQP_MAX_PRIORITY, Transport

logger = logging.getLogger("priority_router")

#: kombu's Redis transport keeps one list per step; 0..9 gives every logical level its own.
REDIS_PRIORITY_STEPS = list(range(10))

#: What keeping each setting at another value costs (warnings here, findings in ``doctor``).
COSTS = {
    "worker_prefetch_multiplier": "each worker process reserves more messages ahead, "
    "so urgent documents published later wait behind them",
    "task_acks_late": "a message is acknowledged before it runs, so the worker fetches "
    "(and commits to) the next one early, and a crashed worker loses its document",
    "priority_steps": "logical priorities that share a step are served in arrival order",
    "queue_order_strategy": "queues are polled in another order than their priority",
    "task_queue_max_priority": "RabbitMQ queues declared without x-max-priority >= 10 "
    "ignore or clip message priorities",
}


def is_explicit(app: Celery, key: str) -> bool:
    """Whether ``key`` was set by the user rather than left at Celery's default.

    Celery's settings are a chain of maps ending with its defaults; a namespaced
    configuration (``CELERY_WORKER_PREFETCH_MULTIPLIER``) stores the key under its
    prefixed name, which ``_to_keys`` lists.
    """
    conf = app.conf
    maps = getattr(conf, "maps", None)
    if not maps:
        return key in conf
    to_keys = getattr(conf, "_to_keys", None)
    names = tuple(to_keys(key)) if callable(to_keys) else (key,)
    return any(name in m for m in maps[:-1] for name in names)


def apply_priority_settings(app: Celery, transport: Transport, warned: set[str]) -> None:
    """Merge the priority-related settings into ``app.conf`` (idempotent).

    A warning about a setting the user chose is logged once per setting in ``warned``.
    """
    conf = app.conf
    _prefer(app, "worker_prefetch_multiplier", 1, warned)
    _prefer(app, "task_acks_late", True, warned)
    if transport is Transport.REDIS:
        options: dict[str, Any] = dict(conf.broker_transport_options or {})
        _prefer_option(options, "priority_steps", REDIS_PRIORITY_STEPS, warned)
        _prefer_option(options, "queue_order_strategy", "priority", warned)
        if options != (conf.broker_transport_options or {}):
            conf.broker_transport_options = options
    elif transport is Transport.AMQP:
        current = conf.task_queue_max_priority
        if current is not None and current < AMQP_MAX_PRIORITY:
            _warn_kept("task_queue_max_priority", current, AMQP_MAX_PRIORITY, warned)


def _prefer(app: Celery, key: str, wanted: object, warned: set[str]) -> None:
    current = app.conf.get(key)
    if current == wanted:
        return
    if is_explicit(app, key):
        _warn_kept(key, current, wanted, warned)
        return
    app.conf[key] = wanted


def _prefer_option(options: dict[str, Any], key: str, wanted: object, warned: set[str]) -> None:
    if key not in options:
        options[key] = wanted
        return
    current = options[key]
    if isinstance(wanted, list) and isinstance(current, list | tuple):
        current = list(current)
    if current != wanted:
        _warn_kept(f"broker_transport_options[{key!r}]", options[key], wanted, warned)


def first_time(warned: set[str], what: str) -> bool:
    """True the first time ``what`` is to be said for an app: each warning is said once,
    however often the router settles on the app's configuration."""
    if what in warned:
        return False
    warned.add(what)
    return True


def _warn_kept(setting: str, current: object, wanted: object, warned: set[str]) -> None:
    if not first_time(warned, setting):
        return
    base = setting.split("[")[-1].strip("'\"]") if "[" in setting else setting
    logger.warning(
        "priority-router keeps your %s=%r (it would set %r): %s",
        setting,
        current,
        wanted,
        COSTS.get(base, "priorities may not take full effect"),
    )
