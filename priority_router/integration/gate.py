"""The gate on the worker: a document over its client's limits is not started; it waits in
the counter store, holding no worker slot and no prefetch slot, until the gate releases it
(docs/caps.md has the design and why each step survives a kill).

- **Admission**, in the worker's consumer, at the moment Celery would hand a received
  document to the pool (after its ETA, if it has one): a client without limits passes
  with nothing read; a limited client's document is admitted by ``store/gate.py``'s
  script, or held there (its message stored, then acknowledged to the broker).
- **Release**: the end of an admitted document (``endings.py``, wherever it ran) frees its
  slot and releases the held documents its limits now allow; each worker's gate thread
  also looks, every :data:`TICK` seconds, at clients whose rate has a token due, clients
  held by a cap (every few seconds, so a changed or lifted limit takes effect), and, for
  borrowing clients, at its own idle slots.  A released document is published again as
  it came, keeps its place among the client's running documents until it arrives, and
  runs on whichever worker takes it.
- **Leases**: each worker renews the leases of the gated documents it holds every
  lease/3 seconds; the slots of a worker that died come back when their leases run out.

Where the store cannot answer, the gate lets documents run (it never holds a document
it cannot store) and says so once per outage, through the router's breaker.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from celery import Celery, bootsteps
from celery.signals import worker_shutdown

from .. import headers as H
from ..limits import Limits
from ..store.client_ids import normalize_client_id
from ..store.gate import RECHECK, Verdict, describe_held
from ..store.limit_store import Snapshot
from . import celery_internals
from .flower import annotate_held
from .installation import installed_router
from .periodic import Periodic
from .redeliver import Unstorable, pack, publish

if TYPE_CHECKING:
    from ..router import PriorityRouter

logger = logging.getLogger("priority_router")

#: Seconds between a worker's looks at due and idle work.
TICK = 0.25


def watch_gate(app: Celery) -> None:
    """Gate ``app``'s documents on its workers (idempotent): the consumer's requests go
    through :func:`admit` while ``app`` has a router installed that is not in dry run."""
    app.steps["consumer"].add(GateStep)


def _gating_router(app: object) -> PriorityRouter | None:
    """The router whose gate ``app``'s documents pass: none without one, or in dry run."""
    router = installed_router(app)
    return None if router is None or router.config.dry_run else router


class GateStep(bootsteps.Step):  # type: ignore[misc]  # Celery is untyped
    """A consumer bootstep: every request goes through the gate on its way to the pool."""

    name = "priority_router.gate"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        if _gating_router(parent.app) is None:
            return
        handle = parent.on_task_request
        app = parent.app

        def on_task_request(request: Any) -> Any:
            router = _gating_router(app)
            if router is None or not admit(app, router, request):
                return None
            return handle(request)

        parent.on_task_request = on_task_request


def client_of(router: PriorityRouter, fields: Any) -> str | None:
    value = fields.get(router.config.client_id_header) if isinstance(fields, Mapping) else None
    return normalize_client_id(value)


def admit(app: Celery, router: PriorityRouter, request: Any) -> bool:
    """Whether ``request`` may start now; a held one is stored and acknowledged here."""
    headers = request.request_dict
    client = client_of(router, headers)
    if client is None:
        return True
    limits = router.limit_store.snapshot().of(client)
    if not limits:
        return True
    try:
        message = pack(request.message)
    except Unstorable as exc:
        router.warn_once(
            f"unstorable:{request.name}",
            "priority-router: a document of task %s cannot be held (%s), so its client's limits do not "
            "apply to it. Fix: publish it with JSON-serializable headers",
            request.name,
            exc,
        )
        return True
    units = router.units_quietly(headers.get(H.COST), client)
    verdict = router.admit_quietly(client, request.id, limits, units, message)
    if verdict is None:
        return True  # the store is down: run it (the breaker has said so)
    _republish(app, router, client, verdict.released)
    if verdict.outcome == "run":
        headers[H.GATED] = True
        return True
    router.index_quietly(client, verdict)
    celery_internals.forget(request)
    _ack_now(request)
    reason = held_reason(verdict, limits)
    # Received again, with the reason: what Flower shows until the document is released.
    request.send_event("task-received", name=request.name, kwargs=annotate_held(request.kwargsrepr, reason))
    if router.metrics is not None:
        router.metrics.record_held(verdict.state)
    logger.debug("priority-router: held %s of client %r: %s", request.id, client, reason)
    return False


def _ack_now(request: Any) -> None:
    """Acknowledge a held document's message at once: queued on the event loop, RabbitMQ's
    ack would go out only at the loop's next wake-up (often a task's end), and the held
    message would keep its prefetch slot until then."""
    try:
        celery_internals.acknowledge_now(request)
    except Exception as exc:
        # The message comes back (RabbitMQ: at once; Redis: after visibility_timeout) and is
        # then acknowledged as a duplicate of the held one.
        logger.warning("priority-router: could not acknowledge held document %s (%s)", request.id, exc)


def held_reason(verdict: Verdict, limits: Limits) -> str:
    """Why a document waits, for Flower and logs."""
    if verdict.outcome == "duplicate":
        return "held already (delivered again)"
    if verdict.state == "rate":
        return f"held by its client's rate {limits.rate}"
    if limits.max_in_flight is not None:
        return f"held by its client's cap: max_in_flight={limits.max_in_flight} running"
    return f"held by its client's cap: max_cost_in_flight={limits.max_cost_in_flight:g} running"


def end_gated(
    app: Celery, router: PriorityRouter, fields: Any, task_id: str, unadmitted: bool = False
) -> None:
    """The end of a document the gate admitted (``unadmitted``: or may hold a place for,
    when its client has limits): free its slot, release what may start."""
    if not isinstance(fields, Mapping) or not (unadmitted or fields.get(H.GATED)):
        return
    client = client_of(router, fields)
    if client is None:
        return
    limits = router.limit_store.snapshot().of(client)
    if unadmitted and not limits and not fields.get(H.GATED):
        return
    borrow = 0
    if limits.borrow:
        queue = (fields.get("delivery_info") or {}).get("routing_key")
        borrow = 1 if isinstance(queue, str) and _probe(app).empty([queue]) else 0
    verdict = router.release_quietly(client, task_id, limits, borrow)
    if verdict is not None:
        _republish(app, router, client, verdict.released)


def _republish(app: Celery, router: PriorityRouter, client: str, released: list[tuple[str, bytes]]) -> None:
    for task_id, message in released:
        try:
            # Marked as gated: its slot is reserved, and its end must free it even if its
            # client's limits are lifted by the time it runs.
            publish(app, message, {H.GATED: True})
        except Exception as exc:
            # Its slot stays reserved with the message kept: the lease gives it back.
            logger.error(
                "priority-router: could not publish released document %s of client %r again (%s: %s); "
                "it is held until its lease runs out (%g s) and released again",
                task_id,
                client,
                type(exc).__name__,
                exc,
                router.gate_store.lease_ms / 1000,
            )
            continue
        router.forget_quietly(client, task_id)
        if router.metrics is not None:
            router.metrics.released.inc()


class QueueProbe:
    """Whether queues are empty, on a broker connection of this process's own."""

    def __init__(self, app: Celery) -> None:
        self._app = app
        self._connection: Any = None
        self._channel: Any = None
        self._lock = threading.Lock()

    def empty(self, queues: Iterable[str]) -> bool:
        """True when no message is ready in any of ``queues``; False when unknown."""
        with self._lock:
            try:
                for queue in queues:
                    if self._channel is None:
                        self._connect()
                    if self._ready(queue):
                        return False
                return True
            except Exception:
                logger.debug("priority-router could not size the queues", exc_info=True)
                self.close()
                return False

    def _connect(self) -> None:
        self._connection = self._app.connection_for_read()
        self._connection.ensure_connection(max_retries=1)
        self._channel = self._connection.channel()

    def _ready(self, queue: str) -> int:
        try:
            _, ready, _ = self._channel.queue_declare(queue=queue, passive=True)
        except Exception as exc:
            # No such queue: nothing waits in it.  kombu's Redis transport says so of an
            # empty queue too (it has no key); RabbitMQ closes the channel.
            if str(getattr(exc, "reply_code", None)) != "404":
                raise
            if not getattr(self._channel, "is_open", True):
                self._channel = self._connection.channel()
            return 0
        return int(ready)

    def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            try:
                connection.close()
            except Exception:
                logger.debug("closing the gate's broker connection failed", exc_info=True)


_probes: weakref.WeakKeyDictionary[Celery, QueueProbe] = weakref.WeakKeyDictionary()


def _probe(app: Celery) -> QueueProbe:
    probe = _probes.get(app)
    if probe is None:
        probe = _probes[app] = QueueProbe(app)
    return probe


class GateThread(Periodic):
    """A worker's daemon thread: renews its gated documents' leases, releases what is due,
    and lends its idle slots to borrowing clients when nothing else waits."""

    doing = "the gate's sweep"
    meanwhile = "held documents wait for their clients' running ones to end"

    def __init__(self, app: Celery, router: PriorityRouter, consumer: Any, concurrency: int) -> None:
        super().__init__("priority-router-gate", TICK)
        self.app = app
        self.router = router
        self._consumer = consumer
        self._concurrency = concurrency
        self._renewed = 0.0
        self._looked = 0.0

    def step(self) -> bool:
        worked = False
        limits = self.router.limit_store.snapshot()
        now = time.monotonic()
        if now - self._renewed >= self.router.gate_store.lease_ms / 3000:
            self._renewed = now
            running = gated_requests(self.router)
            if running:
                self.router.gate_store.renew(running)
                worked = True
        # Without any limit, only documents held before the limits went are left to release;
        # where no limit was ever stored, none can have been held.
        if self.router.limit_store.ever_set and (limits or now - self._looked >= RECHECK):
            self._looked = now
            self._release_due(limits)
            worked = True
        if limits.borrowing:
            self._lend(limits)
        return worked

    def _release_due(self, limits: Snapshot) -> None:
        store = self.router.gate_store
        for client, seen in store.due():
            verdict = store.end(client, "", limits.of(client))
            _republish(self.app, self.router, client, verdict.released)
            store.swept(client, seen, verdict)

    def _lend(self, limits: Snapshot) -> None:
        """This worker's idle slots to borrowing clients' held documents, while its queues are empty."""
        idle = self._concurrency - celery_internals.held_count()
        if idle <= 0:
            return
        store = self.router.gate_store
        borrowing = [c for c in store.holding() if limits.of(c).borrow]
        if not borrowing or not _probe(self.app).empty(self._queues()):
            return
        for client in borrowing:
            verdict = store.end(client, "", limits.of(client), borrow=idle)
            _republish(self.app, self.router, client, verdict.released)
            idle -= len(verdict.released)
            if idle <= 0:
                return

    def _queues(self) -> list[str]:
        task_consumer = getattr(self._consumer, "task_consumer", None)
        if task_consumer is not None:
            return [q.name for q in task_consumer.queues]
        return list(self.app.amqp.queues.consume_from)


def gated_requests(router: PriorityRouter) -> dict[str, list[str]]:
    """The gated documents this worker holds, by client (for their leases)."""
    running: dict[str, list[str]] = defaultdict(list)
    for request in celery_internals.held_requests():
        headers = getattr(request, "request_dict", None) or {}
        if headers.get(H.GATED):
            client = client_of(router, headers)
            if client is not None:
                running[client].append(request.id)
    return running


def say_held(router: PriorityRouter) -> None:
    """At a worker's shutdown: documents still held wait for a router worker to release
    them, so say so, in case this worker is the last one (a switch-off, a rollback)."""
    try:
        held = router.gate_store.held_now()
    except Exception:
        logger.debug("priority-router: could not count held documents at shutdown", exc_info=True)
        return
    if held:
        logger.warning(
            "priority-router: %s; only workers with the router release them. If this was the last such "
            "worker, start one again, or lift the limits (priority-router tier unset CLIENT) and keep one "
            "running until `priority-router status` shows none held (docs/caps.md)",
            describe_held(held),
        )


def start_gate(app: Celery, router: PriorityRouter, consumer: Any, concurrency: int) -> GateThread:
    """Start the gate's thread for the worker whose consumer is ``consumer``."""
    thread = GateThread(app, router, consumer, concurrency)
    uid = f"priority_router:gate:{id(thread)}"

    def on_shutdown(sender: Any = None, **_: Any) -> None:
        worker_shutdown.disconnect(dispatch_uid=uid)
        thread.stop()
        say_held(router)

    worker_shutdown.connect(on_shutdown, weak=False, dispatch_uid=uid)
    thread.start()
    return thread
