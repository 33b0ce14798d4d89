"""The worker pool a Celery worker runs, as far as priorities care.

Green pools (gevent, eventlet) run every task of a worker in one process, and Celery
drives them with its blocking event loop.  Two of the settings that make priorities work
elsewhere break there on the Redis broker:

- ``worker_prefetch_multiplier = 1`` fills the prefetch window with the running tasks;
  kombu then pauses its BRPOP, and nothing wakes the blocking loop when a task's late ack
  frees a slot, so the worker idles until the loop's two-second poll ends.  With the
  multiplier at 0 the window is unlimited, and the pool itself bounds what the worker
  takes: a full gevent or eventlet pool blocks the loop in ``spawn`` until a slot frees,
  so the worker holds at most one document beyond the ones it runs.
- every late ack takes a connection from kombu's channel pool (10 by default); with more
  green threads than that acking at once, acks fail with ``MaxConnectionsError`` and the
  documents are delivered again.

RabbitMQ delivers by credit over one socket, so green pools keep the multiplier at 1 there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from celery import concurrency

#: The pools that run tasks as green threads in one process.
GREEN = frozenset({"gevent", "eventlet"})
#: kombu's Redis transport keeps this many connections per channel for everything but acks.
KOMBU_MAX_CONNECTIONS = 10


@dataclass(frozen=True)
class WorkerPool:
    """A worker's pool: its name (``prefork``, ``threads``, ``solo``, ``gevent``,
    ``eventlet``, or a custom pool's class name) and how many tasks it runs at once."""

    name: str
    concurrency: int
    green: bool = False
    #: An autoscaled pool's fewest slots (``--autoscale MAX,MIN``); ``concurrency`` is its most.
    fewest: int | None = None

    @property
    def redis_connections(self) -> int:
        """Connections kombu's Redis channel needs so that every slot can ack at once."""
        return self.concurrency + KOMBU_MAX_CONNECTIONS

    def __str__(self) -> str:
        if self.fewest is not None:
            return f"{self.name} pool, autoscaled from {self.fewest} to {self.concurrency}"
        return f"{self.name} pool, concurrency {self.concurrency}"


def pool_named(pool: object, concurrency_: object = None) -> WorkerPool:
    """The pool ``celery worker -P POOL -c N`` runs; ``pool`` is an alias, a
    ``module:Class`` path or a pool class, as Celery accepts them."""
    name, green = _identify(pool if pool else "prefork")
    return WorkerPool(name, _concurrency(concurrency_), green)


def pool_of_options(options: Mapping[str, Any], conf: Any) -> WorkerPool:
    """The pool of a worker being built, from the options ``celeryd_init`` passes (the
    command line's) and the app's ``worker_pool`` / ``worker_concurrency`` settings."""
    pool = options.get("pool_cls") or options.get("pool") or conf.get("worker_pool")
    named = pool_named(pool, options.get("concurrency") or conf.get("worker_concurrency"))
    return _autoscaled(named, options.get("autoscale"))


def pool_of_worker(worker: Any) -> WorkerPool:
    """The pool of a ``WorkController`` at ``worker_init`` (its ``pool_cls`` and
    ``concurrency`` are read from the command line and the settings by then)."""
    named = pool_named(getattr(worker, "pool_cls", None), getattr(worker, "concurrency", None))
    return _autoscaled(named, (getattr(worker, "options", None) or {}).get("autoscale"))


def _autoscaled(pool: WorkerPool, autoscale: object) -> WorkerPool:
    """``pool`` as ``--autoscale MAX[,MIN]`` (text, or Celery's parsed pair) sizes it."""
    if isinstance(autoscale, str):
        head, _, tail = autoscale.partition(",")
        autoscale = (head, tail or 0)
    if not isinstance(autoscale, list | tuple) or len(autoscale) != 2:
        return pool
    try:
        most, fewest = int(autoscale[0]), int(autoscale[1])
    except (TypeError, ValueError):
        return pool  # Celery refuses it itself
    return replace(pool, concurrency=max(most, 1), fewest=fewest)


def pool_of_stats(stats: Mapping[str, Any]) -> WorkerPool | None:
    """The pool a live worker reports in ``inspect stats`` (its ``pool`` section, and an
    autoscaled one's ``autoscaler`` section, whose pool reports only its current size), or
    None when it reports none.  A known pool is named by its alias, without importing it."""
    reported = stats.get("pool") or {}
    implementation = reported.get("implementation")
    if not isinstance(implementation, str):
        return None
    named = pool_named(_alias(implementation) or implementation, reported.get("max-concurrency"))
    scaler = stats.get("autoscaler") or {}
    return _autoscaled(named, (scaler.get("max"), scaler.get("min"))) if scaler else named


def _identify(pool: object) -> tuple[str, bool]:
    if isinstance(pool, str):
        if pool in concurrency.ALIASES:
            return ("prefork" if pool == "processes" else pool), pool in GREEN
        pool = concurrency.get_implementation(pool)
    alias = _alias(f"{getattr(pool, '__module__', '')}:{getattr(pool, '__qualname__', '')}")
    if alias is not None:
        return alias, alias in GREEN
    return getattr(pool, "__qualname__", repr(pool)), bool(getattr(pool, "is_green", False))


def _alias(path: str) -> str | None:
    """Celery's alias of the pool class at ``module:Class`` ``path`` ("prefork", not its old
    "processes"), None for a pool Celery does not name."""
    return next((a for a, target in concurrency.ALIASES.items() if target == path and a != "processes"), None)


def _concurrency(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and value.strip().isdigit() and int(value) > 0:
        return int(value)
    # Celery's own default (also for "auto", which it resolves to the CPUs it may use).
    return os.cpu_count() or 2
