"""Finding workers that consume the router's queues without the router's settings.

A worker whose app has no router installed polls kombu's default four Redis priority
lists (``priority_steps`` 0, 3, 6, 9), so documents the router sends at 1, 2, 4, 5, 7 or
8 wait in lists nobody reads, forever, with nothing in any log.  On RabbitMQ such a
worker declares its queue without ``x-max-priority``.  Workers answer Celery's own
remote-control ``active_queues`` and ``conf`` inspections, so a publisher can see this.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from celery import Celery
from celery.app.defaults import DEFAULTS
from kombu.transport.redis import PRIORITY_STEPS as KOMBU_PRIORITY_STEPS

from ..forks import renew_after_fork
from ..thresholds import LEAST_URGENT, MOST_URGENT
from .brokers import Transport, to_wire
from .celery_settings import prefetch_disabled

logger = logging.getLogger("priority_router")

FIX = (
    "install the router in that worker's app too (PriorityRouter(...).install(app) where the "
    "worker's Celery app is created), or switch its dry run off if it runs one "
    "(PRIORITY_ROUTER_DRY_RUN in that worker's environment), then restart the worker"
)


@dataclass(frozen=True)
class BlindWorker:
    """A worker that consumes ``queue`` but cannot take every priority the router sends."""

    worker: str
    queue: str
    #: Logical priorities whose documents this worker never takes (Redis); all on RabbitMQ.
    unseen: tuple[int, ...]
    detail: str


@dataclass(frozen=True)
class Consumer:
    """One worker consuming one queue, as the worker answered Celery's inspections."""

    worker: str
    queue: str
    #: The queue as the worker declared it (``active_queues``).
    declared: dict[str, Any]
    #: The worker's settings that differ from Celery's defaults (``conf``); None when not
    #: asked, or not answered in time.
    conf: dict[str, Any] | None


def consumers(
    app: Celery, queues: Iterable[str] | None = None, with_conf: bool = True, timeout: float = 1.0
) -> list[Consumer] | None:
    """The workers consuming ``queues`` (all, if None), with their settings when
    ``with_conf``: one ``active_queues`` broadcast, and one ``conf``.  None when no worker
    answered within ``timeout`` seconds.  A worker that answered the first and not the
    second in time (a busy one) has ``conf`` None, as when it was not asked: a guess at its
    settings would judge a router worker by Celery's defaults."""
    # An explicit connection, closed here: a pooled one could outlive a closed app.
    with app.connection_for_write() as conn:
        inspect = app.control.inspect(timeout=timeout, connection=conn)
        active: dict[str, list[dict[str, Any]]] = inspect.active_queues() or {}
        confs: dict[str, dict[str, Any]] = {}
        if active and with_conf:
            confs = inspect.conf(with_defaults=False) or {}
    if not active:
        return None
    wanted = None if queues is None else set(queues)
    found = []
    for worker, consumed in sorted(active.items()):
        for queue in consumed or ():
            name = queue.get("name")
            if isinstance(name, str) and (wanted is None or name in wanted):
                found.append(Consumer(worker, name, queue, confs.get(worker)))
    return found


def eta_held(app: Celery, workers: Collection[str], timeout: float = 1.0) -> dict[str, int]:
    """How many eta and countdown tasks each of ``workers`` holds until they come due
    (Celery's ``inspect scheduled``); a worker that did not answer within ``timeout``
    seconds is left out."""
    if not workers:
        return {}
    with app.connection_for_write() as conn:
        inspect = app.control.inspect(sorted(workers), timeout=timeout, connection=conn, limit=len(workers))
        answered: dict[str, list[Any]] = inspect.scheduled() or {}
    return {worker: len(held or ()) for worker, held in answered.items() if worker in workers}


def blind_workers(
    app: Celery, transport: Transport, queues: Iterable[str] | None = None, timeout: float = 1.0
) -> list[BlindWorker] | None:
    """Workers consuming ``queues`` (all, if None) that cannot see every priority.

    None when no worker answered the inspection within ``timeout`` seconds.  Only the Redis
    broker needs the workers' settings (their priority steps): on RabbitMQ the queue's
    declaration says it all.
    """
    found = consumers(app, queues, with_conf=transport is Transport.REDIS, timeout=timeout)
    return None if found is None else blindness(found, transport)


def blindness(found: Iterable[Consumer], transport: Transport) -> list[BlindWorker]:
    """The consumers of ``found`` that cannot see every priority (on Redis, of those whose
    settings are known)."""
    return [blind for c in found if (blind := _blindness(c, transport)) is not None]


#: What to do about a worker that takes documents ahead of their turn.
AHEAD_FIX = (
    "run the worker with the router installed and dry run off (it sets both at start), or set "
    "worker_prefetch_multiplier = 1 and task_acks_late = True in that worker's app; then restart it"
)


def taking_ahead(found: Iterable[Consumer], transport: Transport | None = None) -> list[str]:
    """One line per worker of ``found`` whose own settings take documents ahead of their
    turn: a prefetch multiplier above 1 (0 is what a green pool on Redis runs with) without
    Celery's ``worker_disable_prefetch`` on ``transport``, or early acknowledgements (a
    slot's next document is fetched as its current one starts).  A worker without the
    router runs Celery's defaults, both of them; so does one with the router in dry run."""
    said: dict[str, str] = {}
    for c in found:
        if c.conf is None or c.worker in said:
            continue
        # ``conf`` gives only what differs from Celery's defaults.
        multiplier = c.conf.get("worker_prefetch_multiplier", DEFAULTS["worker_prefetch_multiplier"])
        acks_late = c.conf.get("task_acks_late", DEFAULTS["task_acks_late"])
        bounded = prefetch_disabled(c.conf, transport) or (isinstance(multiplier, int) and multiplier <= 1)
        if bounded and acks_late is True:
            continue
        said[c.worker] = (
            f"worker {c.worker} (consuming {c.queue!r}) runs worker_prefetch_multiplier={multiplier!r}, "
            f"task_acks_late={acks_late!r}: it takes documents before their turn, so lighter clients' "
            "documents wait behind those it already holds (a worker without the router, or with it in "
            "dry run)"
        )
    return list(said.values())


def polled_steps(consumer: Consumer) -> set[int] | None:
    """The priority steps whose Redis lists ``consumer`` polls; None when its settings are
    unknown."""
    if consumer.conf is None:
        return None
    options = consumer.conf.get("broker_transport_options") or {}
    steps = options.get("priority_steps", KOMBU_PRIORITY_STEPS) if isinstance(options, dict) else []
    return {int(s) for s in steps if isinstance(s, int | float)}


def _blindness(consumer: Consumer, transport: Transport) -> BlindWorker | None:
    worker, name = consumer.worker, consumer.queue
    if transport is Transport.REDIS:
        polled = polled_steps(consumer)
        if polled is None:
            return None  # what it polls is unknown
        unseen = tuple(p for p in range(MOST_URGENT, LEAST_URGENT + 1) if to_wire(p, transport) not in polled)
        if not unseen:
            return None
        return BlindWorker(
            worker,
            name,
            unseen,
            f"worker {worker} consumes queue {name!r} polling only the priority lists "
            f"{sorted(polled)}, so documents at priorities {', '.join(map(str, unseen))} are never "
            "taken from it",
        )
    if transport is Transport.AMQP:
        args = consumer.declared.get("queue_arguments") or {}
        if args.get("x-queue-type") == "quorum" or args.get("x-max-priority"):
            return None
        return BlindWorker(
            worker,
            name,
            tuple(range(MOST_URGENT, LEAST_URGENT + 1)),
            f"worker {worker} consumes queue {name!r} declared without x-max-priority, so it "
            "is served in arrival order",
        )
    return None


def check_at_start(app: Celery, transport: Transport, queues: Iterable[str], hostname: str) -> None:
    """A router worker's one look, as it starts, at the other workers consuming its queues
    (one broadcast per worker start, in a daemon thread): each blind one is a WARNING."""

    def look() -> None:
        try:
            found = blind_workers(app, transport, set(queues)) or []
        except Exception:
            logger.debug("priority-router could not inspect the workers", exc_info=True)
            return
        for blind in found:
            if blind.worker != hostname:  # itself: it runs the router
                _warn(blind)

    threading.Thread(target=look, name="priority-router-worker-check", daemon=True).start()


class Publishing(Protocol):
    """What the watch reads of a publisher (``publish.PublishReceiver``)."""

    #: The broker's kind the app settled on, None before it did.
    transport: Transport | None
    #: The queues it published to.
    queues_seen: set[str]
    dry_run: bool


class ConsumerWatch:
    """A publisher's background check, every ``interval`` seconds while it publishes,
    that no worker consuming its queues is blind to some priorities.  Each blind worker
    and queue is logged once, as a WARNING naming the fix.  A router in dry run sends
    plain Celery's priorities, which every worker sees, so it does not check."""

    FIRST_CHECK = 5.0

    def __init__(self, app: Celery, receiver: Publishing, interval: float) -> None:
        self._app = weakref.ref(app)
        # The receiver knows the transport the app settled on and the queues it published to.
        self._receiver = receiver
        self._interval = interval
        self._published = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned: set[tuple[str, str]] = set()
        renew_after_fork(self)

    def after_fork(self) -> None:
        # Threads do not survive fork; a forked publisher starts its own checks.
        self._thread = None

    def published(self) -> None:
        """Note a publish; starts the checks in this process on first use."""
        if self._published.is_set() or self._receiver.dry_run:
            return
        if self._thread is None:
            self._start()
        self._published.set()

    def _start(self) -> None:
        with _start_lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(
                target=self._run, name="priority-router-consumer-check", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._published.set()

    def _run(self) -> None:
        delay = min(self.FIRST_CHECK, self._interval)
        while not self._stop.wait(delay):
            delay = self._interval
            if not self._published.is_set():
                continue
            self._published.clear()
            self.check()

    def check(self) -> list[BlindWorker]:
        app = self._app()
        transport = self._receiver.transport
        if app is None or transport is None or self._stop.is_set() or self._receiver.dry_run:
            return []
        try:
            found = blind_workers(app, transport, set(self._receiver.queues_seen)) or []
        except Exception:
            logger.debug("priority-router could not inspect the workers", exc_info=True)
            return []
        for blind in found:
            key = (blind.worker, blind.queue)
            if key not in self._warned:
                self._warned.add(key)
                _warn(blind)
        return found


def _warn(blind: BlindWorker) -> None:
    logger.warning(
        "priority-router: %s, because that worker runs without priority-router. Fix: %s", blind.detail, FIX
    )


_start_lock = threading.Lock()
