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
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from celery import Celery
from kombu.transport.redis import PRIORITY_STEPS as KOMBU_PRIORITY_STEPS

from ..forks import renew_after_fork
from ..thresholds import LEAST_URGENT, MOST_URGENT
from .brokers import Transport, to_wire

logger = logging.getLogger("priority_router")

FIX = (
    "install the router in that worker's app too (PriorityRouter(...).install(app) where the "
    "worker's Celery app is created), then restart the worker"
)


@dataclass(frozen=True)
class BlindWorker:
    """A worker that consumes ``queue`` but cannot take every priority the router sends."""

    worker: str
    queue: str
    #: Logical priorities whose documents this worker never takes (Redis); all on RabbitMQ.
    unseen: tuple[int, ...]
    detail: str


def blind_workers(
    app: Celery, transport: Transport, queues: Iterable[str] | None = None, timeout: float = 1.0
) -> list[BlindWorker] | None:
    """Workers consuming ``queues`` (all, if None) that cannot see every priority.

    None when no worker answered the inspection within ``timeout`` seconds.
    """
    # An explicit connection, closed here: a pooled one could outlive a closed app.
    with app.connection_for_write() as conn:
        inspect = app.control.inspect(timeout=timeout, connection=conn)
        active: dict[str, list[dict[str, Any]]] = inspect.active_queues() or {}
        confs: dict[str, dict[str, Any]] = {}
        if active and transport is Transport.REDIS:
            confs = inspect.conf(with_defaults=False) or {}
    if not active:
        return None
    wanted = None if queues is None else set(queues)
    found = []
    for worker, consumed in sorted(active.items()):
        if transport is Transport.REDIS and worker not in confs:
            # It answered one inspection but not the other in time (a busy worker): what it
            # polls is unknown, and a guess would call a router worker blind.
            continue
        for queue in consumed or ():
            name = queue.get("name")
            if not isinstance(name, str) or (wanted is not None and name not in wanted):
                continue
            blind = _blindness(worker, name, queue, confs.get(worker) or {}, transport)
            if blind is not None:
                found.append(blind)
    return found


def _blindness(
    worker: str, name: str, queue: dict[str, Any], conf: dict[str, Any], transport: Transport
) -> BlindWorker | None:
    if transport is Transport.REDIS:
        options = conf.get("broker_transport_options") or {}
        steps = options.get("priority_steps", KOMBU_PRIORITY_STEPS) if isinstance(options, dict) else []
        polled = {int(s) for s in steps if isinstance(s, int | float)}
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
        args = queue.get("queue_arguments") or {}
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
