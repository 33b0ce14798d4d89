"""The gate on the worker: a document over its client's limits is not started; it waits in
the broker, in its client's holding queue (``holding.py``), holding no worker slot and no
prefetch slot, until the gate releases it (docs/caps.md has the design and why each step
survives a kill).  The counter store only counts (``store/gate.py``): it may be lost at
any moment, and no document goes with it.

- **Admission**, in the worker's consumer, at the moment Celery would hand a received
  document to the pool (after its ETA, if it has one): a client without limits passes
  with nothing read; a limited client's document is admitted by ``store/gate.py``'s
  script, or counted held there, published to its holding queue, then acknowledged.
- **Release**: the end of an admitted document (``endings.py``, wherever it ran) frees its
  slot and releases the held documents its limits now allow; each worker's gate thread
  also looks, every :data:`TICK` seconds, at clients whose rate has a token due, clients
  held by a cap (every few seconds, so a changed or lifted limit takes effect), and, for
  borrowing clients, at its own idle slots.  A released document is published again where
  it first went, keeps its place among the client's running documents until it arrives,
  and runs on whichever worker takes it.
- **Leases**: each worker renews the leases of the gated documents it holds every
  lease/3 seconds; the slots of a worker that died come back when their leases run out.
- **Outages of the store**: documents run ungated (the gate says so once, through its
  breaker); an end that could not reach the store is kept and sent again every
  :data:`RETRY` seconds until it does, so a capped client is not stalled by slots its
  finished documents still hold; the thread finds every holding queue again from the
  broker's index (:meth:`Holding.indexed`) when the store lost the clients it knew.
- **A Redis user refused a command the gate uses** (``NOPERM``, ``store/permissions.py``):
  a configuration error, found by each worker's check of every command at start
  (:meth:`GateStore.check`) or when a call is refused.  The gate of that process opens for
  good (until it restarts), with one ERROR naming the command and the ACL rule: documents
  run without their clients' limits, and its thread releases every document its holding
  queues hold, since no end could be counted to release them.
"""

from __future__ import annotations

import functools
import logging
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from celery import Celery, bootsteps
from celery.signals import worker_shutdown

from .. import headers as H
from ..limits import Limits
from ..redact import redact_url
from ..store.breaker import STORE_ERRORS, CircuitBreaker
from ..store.client_ids import normalize_client_id
from ..store.connection import ping_every_master
from ..store.gate import RECHECK, RELEASE_BATCH, REMEMBER_SENT_MS, Verdict, describe_held
from ..store.limit_store import Snapshot
from ..store.old_held import LOCK_MS
from ..store.owed import OwedEnds
from ..store.permissions import Refusal, acl_user, refusal
from . import celery_internals
from .adopt import ADOPT_EVERY, Adopter
from .clients import client_from_call
from .flower import annotate_held
from .holding import Held, Holding, HoldingUnavailable
from .installation import installed_engine
from .periodic import Periodic
from .starvation import consumed_queues

if TYPE_CHECKING:
    from ..engine import Engine

logger = logging.getLogger("priority_router")
T = TypeVar("T")

#: Seconds between a worker's looks at due and idle work.
TICK = 0.25


#: Seconds between retries of the ends that could not reach the counter store.
RETRY = 0.5
#: Seconds between a worker's readings of the broker's index of holding queues.
RECONCILE = 2.0


class Gate:
    """One process's gate for one router: its counter store, its holding queues on the
    app's broker, a breaker of its own, and the ends it still owes the store."""

    def __init__(self, app: Celery, router: Engine) -> None:
        self.app = app
        self.router = router
        self.store = router.gate_store
        self.holding = Holding(app, router.config.key_prefix)
        self.breaker = CircuitBreaker(
            router.config.cooldown,
            f"the gate's counter store at {redact_url(router.config.redis_url)}",
            meanwhile="documents of limited clients run without their limits, and the ends of gated "
            "documents are kept to send later",
            probe=lambda: ping_every_master(router.redis),
        )
        #: What the store refused the gate's Redis user, once it has: the gate is then open.
        self.refused: Refusal | None = None
        self.owed: OwedEnds[tuple[str, str]] = OwedEnds()
        #: How long a published release is remembered: longer than the broker takes to give
        #: a held copy back to its holding queue after its releaser died.
        self.remember_ms = _remember_sent_ms(app)

    def call(self, use: Callable[[], T]) -> T | None:
        """``use()`` on the store, through the breaker: None when it is open, the gate is
        open (a refusal), or the store fails (connection and Redis errors only: anything else
        is a bug, and raises)."""
        if self.refused is not None or not self.breaker.allow():
            return None
        try:
            result = use()
        except STORE_ERRORS as exc:
            if not self.refuse(exc):
                self.breaker.failure(exc)
            return None
        self.breaker.success()
        return result

    def end(self, client: str, task_id: str, borrow: int = 0) -> None:
        """The end of a gated document: free its slot and release what may start; kept to
        send again when the store cannot answer."""
        limits = self.router.limit_store.snapshot().of(client)
        verdict = self.call(lambda: self.store.end(client, task_id, limits, borrow))
        if verdict is None and self.refused is None:
            self.owed.add((client, task_id))
            self.owed.retry_every(RETRY, self.send_owed)
        if verdict is None:
            return
        self.call(lambda: self.release(client, limits, verdict))

    def send_owed(self) -> None:
        """Send the ends kept while the store failed, oldest first (the owed-ends thread)."""
        ends = self.owed.take(500)
        for sent, (client, task_id) in enumerate(ends):
            limits = self.router.limit_store.snapshot().of(client)
            try:
                verdict = self.store.end(client, task_id, limits)
            except STORE_ERRORS as exc:
                if not self.refuse(exc):  # refused: the gate is open, nothing waits for them
                    self.owed.give_back(ends[sent:])
                return
            self.breaker.success()
            self.call(functools.partial(self.release, client, limits, verdict))

    def refuse(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a refusal (``NOPERM``); the first opens the gate, with one ERROR."""
        refused = refusal(exc)
        if refused is None or self.refused is not None:
            return refused is not None
        self.refused = refused
        config = self.router.config
        limited = bool(self.router.limit_store.snapshot())
        logger.error(
            "priority-router: the gate's counter store at %s refuses %s to its Redis user (%s): a "
            "configuration error, not an outage. This process's gate is open until it restarts: %s. "
            "Fix: %s, then restart the workers",
            redact_url(config.redis_url),
            refused.problem(),
            refused.said,
            "documents of clients with limits run without them, and the documents held are released"
            if limited
            else "no client has limits now, so no document is held; were one given limits, its "
            "documents would run without them",
            refused.fix(acl_user(config.redis_url), config.key_prefix),
        )
        return True

    def check(self) -> bool:
        """Check that the store lets the gate's user run every command the gate uses (a
        refusal opens the gate); whether the store answered."""
        return self.refused is not None or self.call(self.store.check) is not None

    def release_all(self) -> None:
        """An open gate's release: every document in the holding queues the broker's index
        names is sent where it first went, ungated, as no end could be counted."""
        with self.holding.indexed() as (clients, keep):
            for client in clients:
                while (held := self.holding.take(client)) is not None:
                    held.send({})
                    held.drop()
                    logger.info(
                        "priority-router: released %s of client %r (the gate is open)", held.task_id, client
                    )
            keep([])

    def release(
        self, client: str, limits: Limits, verdict: Verdict, most: int = RELEASE_BATCH
    ) -> tuple[int, Verdict]:
        """Release the client's held documents while its limits allow (``verdict``: the
        store's last word on the client); how many were released, and the store's word
        after them."""
        try:
            released, verdict = self.store.release(
                client, limits, verdict, _HoldingQueue(self, client), self.remember_ms, most
            )
        except HoldingUnavailable as exc:
            # The broker failed: what was taken is back in its holding queue (put back, or
            # returned when the connection went), and a sweep releases it.
            logger.error(
                "priority-router: could not release documents of client %r (%s: %s); they stay in its "
                "holding queue and are released again",
                client,
                type(exc).__name__,
                exc,
            )
            return 0, verdict
        if self.router.metrics is not None and released:
            self.router.metrics.released.inc(len(released))
        return len(released), verdict

    def queues_empty(self, queues: Iterable[str]) -> bool:
        """True when no message is ready in any of ``queues``; False when unknown."""
        try:
            return all(self.holding.ready(queue) == 0 for queue in queues)
        except HoldingUnavailable:
            logger.debug("priority-router could not size the queues", exc_info=True)
            return False

    def reconcile(self) -> None:
        """Read the broker's index of holding queues: each client named whose queue still
        has documents is counted held in the store and looked at by the sweeps; a client
        whose queue is empty leaves the index, unless the store counts a hold under way."""
        snapshot = self.router.limit_store.snapshot()
        with self.holding.indexed() as (clients, keep):
            still = []
            for client in clients:
                limits = snapshot.of(client)
                queued = self.holding.count(client)
                if queued:
                    verdict = self.store.mark(client, queued, limits)
                    self.store.note_held(client, verdict)
                else:
                    verdict = self.store.clear(client, limits)
                if queued or verdict.held:
                    still.append(client)
            keep(still)


def _remember_sent_ms(app: Celery) -> int:
    options = app.conf.broker_transport_options or {}
    timeout = options.get("visibility_timeout")
    if isinstance(timeout, (int, float)) and timeout > 0:
        return max(REMEMBER_SENT_MS, round((timeout + 300) * 1000))
    return REMEMBER_SENT_MS


class _HoldingQueue:
    """One client's holding queue as the store's release loop takes from it."""

    def __init__(self, gate: Gate, client: str) -> None:
        self._gate = gate
        self._client = client

    def take(self) -> _Taken | None:
        held = self._gate.holding.take(self._client)
        if held is None:
            return None
        return _Taken(held, self._gate.router.units_quietly(held.cost, self._client))


class _Taken:
    def __init__(self, held: Held, units: int) -> None:
        self._held = held
        self.task_id = held.task_id
        self.units = units

    def send(self) -> None:
        # Marked as gated: its slot is reserved, and its end must free it even if its
        # client's limits are lifted by the time it runs.
        self._held.send({H.GATED: True})

    def drop(self) -> None:
        self._held.drop()

    def put_back(self) -> None:
        self._held.put_back()


_gates: weakref.WeakKeyDictionary[Celery, Gate] = weakref.WeakKeyDictionary()


def gate_of(app: Celery, router: Engine) -> Gate:
    """This process's gate for ``app`` (built on first use)."""
    gate = _gates.get(app)
    if gate is None or gate.router is not router:
        gate = _gates[app] = Gate(app, router)
    return gate


def watch_gate(app: Celery) -> None:
    """Gate ``app``'s documents on its workers (idempotent): the consumer's requests go
    through :func:`admit` while ``app`` has a router installed that is not in dry run."""
    app.steps["consumer"].add(GateStep)


def _gating_router(app: object) -> Engine | None:
    """The router whose gate ``app``'s documents pass: none without one, or in dry run."""
    router = installed_engine(app)
    return None if router is None or router.config.dry_run else router


class GateStep(bootsteps.Step):  # type: ignore[misc]  # Celery is untyped
    """A consumer bootstep: every request goes through the gate on its way to the pool."""

    name = "priority_router.gate"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        if _gating_router(parent.app) is None:
            return
        app = parent.app

        def gated(handle: Callable[[Any], Any]) -> Callable[[Any], Any]:
            def on_task_request(request: Any) -> Any:
                router = _gating_router(app)
                if router is None or not admit(app, router, request):
                    return None
                return handle(request)

            return on_task_request

        celery_internals.wrap_task_requests(parent, gated)


def client_of(router: Engine, fields: Any, request: Any = None) -> str | None:
    """The document's client: its client id header, else (given its worker request) its
    keyword argument or the ``client_id_getter``'s answer, as a publisher finds it.  A
    non-router publisher (another language) may name the client only in the arguments."""
    value = fields.get(router.config.client_id_header) if isinstance(fields, Mapping) else None
    client = normalize_client_id(value)
    if client is not None or request is None:
        return client
    call = celery_internals.request_call(request)
    if call is None or not isinstance(fields, Mapping):
        return None
    config = router.config
    return client_from_call(config.client_id_kwarg, config.client_id_getter, *call, dict(fields))


def admit(app: Celery, router: Engine, request: Any) -> bool:
    """Whether ``request`` may start now; a held one is moved to its client's holding queue
    here and acknowledged."""
    headers = celery_internals.request_headers(request)
    if headers is None:
        return True
    snapshot = router.limit_store.snapshot()
    if not snapshot:
        return True  # no client has limits: nothing to look up
    client = client_of(router, headers, request)
    if client is None:
        return True
    # Named here for the document's end and its lease, when only its arguments named it.
    headers[router.config.client_id_header] = client
    limits = snapshot.of(client)
    if not limits:
        return True
    gate = gate_of(app, router)
    units = router.units_quietly(headers.get(H.COST), client)
    verdict = gate.call(lambda: gate.store.admit(client, request.id, limits, units))
    if verdict is None:
        return True  # the store is down: run it (the breaker has said so)
    if verdict.outcome == "run":
        headers[H.GATED] = True
        return True
    if verdict.outcome in ("held", "duplicate"):
        # A duplicate was held before and delivered again (its worker died before the
        # acknowledgement): its copy may or may not have reached the holding queue, so it
        # goes there again; the release drops a second copy.
        try:
            gate.holding.hold(request.message, request.id, client, first=verdict.held == 1)
        except HoldingUnavailable as exc:
            # Not held anywhere: it runs, and the store forgets it was counted held.
            logger.error(
                "priority-router: could not move document %s of client %r to its holding queue (%s: %s); "
                "it runs without its client's limits",
                request.id,
                client,
                type(exc).__name__,
                exc,
            )
            if verdict.outcome == "held":
                gate.call(lambda: gate.store.take(client, request.id, Limits(), units))
            headers[H.GATED] = True
            return True
    celery_internals.forget(request)
    _ack_now(request)
    if verdict.outcome == "duplicate":
        return False
    reason = held_reason(verdict, limits)
    # Received again, with the reason: what Flower shows until the document is released.
    request.send_event("task-received", name=request.name, kwargs=annotate_held(request.kwargsrepr, reason))
    if router.metrics is not None:
        router.metrics.record_held(verdict.state)
    logger.debug("priority-router: held %s of client %r: %s", request.id, client, reason)

    def release_and_index() -> None:
        # Held behind earlier documents that may start now (their limits lifted meanwhile);
        # the sweeps look at the client again when its state says.
        _, after = gate.release(client, limits, verdict)
        gate.store.note_held(client, after)

    gate.call(release_and_index)
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
    if verdict.state == "free":
        return "held behind its client's earlier documents"
    if limits.max_in_flight is not None:
        return f"held by its client's cap: max_in_flight={limits.max_in_flight} running"
    return f"held by its client's cap: max_cost_in_flight={limits.max_cost_in_flight:g} running"


def end_gated(
    app: Celery, router: Engine, fields: Any, task_id: str, unadmitted: bool = False, request: Any = None
) -> None:
    """The end of a document the gate admitted (``unadmitted``: or may hold a place for,
    when its client has limits, and ``request`` is its worker request): free its slot,
    release what may start."""
    if not isinstance(fields, Mapping) or not (unadmitted or fields.get(H.GATED)):
        return
    client = client_of(router, fields, request)
    if client is None:
        return
    limits = router.limit_store.snapshot().of(client)
    if unadmitted and not limits and not fields.get(H.GATED):
        return
    gate = gate_of(app, router)
    borrow = 0
    if limits.borrow:
        queue = (fields.get("delivery_info") or {}).get("routing_key")
        borrow = 1 if isinstance(queue, str) and gate.queues_empty([queue]) else 0
    gate.end(client, task_id, borrow)


class GateThread(Periodic):
    """A worker's daemon thread: renews its gated documents' leases, releases what is due,
    lends its idle slots to borrowing clients when nothing else waits, and reads the
    broker's index of holding queues."""

    doing = "the gate's sweep"
    meanwhile = "documents a cap holds, if any, wait for their clients' running ones to end"

    def __init__(self, app: Celery, router: Engine, consumer: Any, concurrency: int) -> None:
        super().__init__("priority-router-gate", TICK)
        self.app = app
        self.router = router
        self.gate = gate_of(app, router)
        self._consumer = consumer
        self._queues = consumed_queues(consumer)
        self._concurrency = concurrency
        self._renewed = 0.0
        self._looked = 0.0
        self._reconciled = 0.0
        self._adopter = Adopter(self.gate)
        self._adopted = -ADOPT_EVERY  # at the first step
        #: Whether the gate's commands were checked (the store answered the check).
        self.checked = False

    def step(self) -> bool:
        gate = self.gate
        if gate.refused is None and not self.checked:
            self.checked = gate.check()
        if gate.refused is not None:
            now = time.monotonic()
            if now - self._reconciled >= RECONCILE:
                self._reconciled = now
                gate.release_all()
            return True
        try:
            return self._step()
        except STORE_ERRORS as exc:
            if not gate.refuse(exc):
                raise
            return True

    def _step(self) -> bool:
        worked = False
        limits = self.router.limit_store.snapshot()
        now = time.monotonic()
        store = self.gate.store
        if now - self._renewed >= store.lease_ms / 3000:
            self._renewed = now
            running = gated_requests(self.router)
            if running:
                store.renew(running)
                worked = True
        if now - self._reconciled >= RECONCILE:
            self._reconciled = now
            self.gate.reconcile()
            worked = True
        if now - self._adopted >= ADOPT_EVERY:
            # An older release's held documents, in the counter store (docs/lifecycle.md).
            self._adopted = now
            self._adopter.adopt()
            if self._adopter.locked:
                # Another worker adopts, or one was killed adopting: look again once its lock ran out.
                self._adopted = now - ADOPT_EVERY + LOCK_MS / 1000
            worked = True
        # Without any limit, only documents held before the limits went are left to release;
        # where no limit was ever stored, none can have been held (but the broker's index).
        if limits or now - self._looked >= RECHECK:
            self._looked = now
            self._release_due(limits)
            worked = True
        if limits.borrowing:
            self._lend(limits)
        if self.gate.owed:
            self.gate.send_owed()
        return worked

    def on_failure(self) -> None:
        self.gate.holding.close()

    def _release_due(self, limits: Snapshot) -> None:
        store = self.gate.store
        for client, seen in store.due():
            own = limits.of(client)
            _, verdict = self.gate.release(client, own, store.end(client, "", own))
            store.swept(client, seen, verdict)

    def _lend(self, limits: Snapshot) -> None:
        """This worker's idle slots to borrowing clients' held documents, while its queues are empty."""
        idle = self._pool_size() - celery_internals.held_count()
        if idle <= 0:
            return
        store = self.gate.store
        borrowing = [c for c in store.holding() if limits.of(c).borrow]
        if not borrowing or not self.gate.queues_empty(self._queues()):
            return
        for client in borrowing:
            verdict = store.end(client, "", limits.of(client), borrow=idle)
            idle -= self.gate.release(client, limits.of(client), verdict)[0]
            if idle <= 0:
                return

    def _pool_size(self) -> int:
        """The pool's processes now (an autoscaled pool grows and shrinks)."""
        return celery_internals.pool_size(self._consumer) or self._concurrency


def gated_requests(router: Engine) -> dict[str, list[str]]:
    """The gated documents this worker holds, by client (for their leases)."""
    running: dict[str, list[str]] = defaultdict(list)
    for request in celery_internals.held_requests():
        headers = celery_internals.request_headers(request) or {}
        if headers.get(H.GATED):
            client = client_of(router, headers)
            if client is not None:
                running[client].append(request.id)
    return running


def say_held(router: Engine) -> None:
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


def start_gate(app: Celery, router: Engine, consumer: Any, concurrency: int) -> GateThread:
    """Start the gate's thread for the worker whose consumer is ``consumer``."""
    thread = GateThread(app, router, consumer, concurrency)
    uid = f"priority_router:gate:{id(thread)}"

    def on_shutdown(sender: Any = None, **_: Any) -> None:
        worker_shutdown.disconnect(dispatch_uid=uid)
        thread.stop()
        say_held(router)

    worker_shutdown.connect(on_shutdown, weak=False, dispatch_uid=uid)
    # Before the consumer admits its first document; the thread checks again should the
    # store not answer now.
    thread.checked = thread.gate.check()
    thread.start()
    return thread
