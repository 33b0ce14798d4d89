"""The ``before_task_publish`` receiver that stamps each document with its priority.

The rule, in order:

1. A task that is not counted (``tasks`` patterns) keeps what Celery gives it.
2. A retry keeps the priority it had and is not counted again.
3. A priority the caller chose (``apply_async(priority=...)``, the task's declared
   ``priority``, a route's) reaches the broker unchanged; the document is still counted,
   and ``priority_router_reason`` says ``explicit``.  The app-wide
   ``task_default_priority`` is not a choice: counted documents get the router's priority.
4. A task published from a running task of the same client (or without a client of its
   own) inherits the parent's priority and is not counted again.
5. Otherwise the client's document is counted and priced; without a client id it gets
   the app's ``task_default_priority`` if set, else the router's ``default_priority``.

In dry run every step is the same and the decision goes into the headers, Flower's
``kwargsrepr`` and the metrics, but the message's ``priority`` and ``expiration``
properties stay as Celery set them, and a ``priority_router_dry_run`` header says so.
"""

from __future__ import annotations

import difflib
import fnmatch
import logging
import math
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery import Celery

from .. import headers as H
from ..decision import Decision, Reason
from ..store.client_ids import normalize_client_id
from ..thresholds import DEFAULT_THRESHOLDS, is_priority, table_name
from .brokers import Transport, from_wire, to_wire
from .celery_internals import sent_event, tasks_running
from .clients import client_from_call
from .consumers import ConsumerWatch
from .flower import annotate_kwargsrepr
from .sender import publishing_app, republishing, sending
from .stranded import StrandedWatch

if TYPE_CHECKING:
    from ..config import RouterConfig
    from .publisher_pause import PublishPause

logger = logging.getLogger("priority_router")

#: Longest client id copied into the message headers.
MAX_HEADER_ID = 1024


def own_tasks(app: Celery) -> list[str]:
    """The names of the tasks ``app`` registers, Celery's own (``celery.*``) left out."""
    return sorted(name for name in app.tasks if not name.startswith("celery."))


def mistyped_tasks(patterns: tuple[str, ...] | None, registered: list[str]) -> dict[str, str]:
    """The ``tasks`` patterns that match none of ``registered`` but are close to one of
    them, each with that name: a typo, which silently leaves the task uncounted.  A pattern
    near no registered task may name tasks sent by name (``send_task``), so it is let be."""
    mistyped = {}
    for pattern in patterns or ():
        if not any(fnmatch.fnmatchcase(name, pattern) for name in registered):
            close = difflib.get_close_matches(pattern, registered, n=1, cutoff=0.75)
            if close:
                mistyped[pattern] = close[0]
    return mistyped


#: ``decide(client_id, task_id, cost, provisional=False)`` (``Engine.decide``): count one
#: document and price it, never raising; ``task_id`` is None unless ``mode="inflight"``,
#: ``cost`` None when the document gives none.
Decide = Callable[..., Decision]
#: ``settle(app)``: settle on the app's configuration now; the transport, or None.
Settle = Callable[[Celery], "Transport | None"]


class PublishReceiver:
    """Routes one app's publishes; created by ``install`` and called for each publish.

    ``settle`` is called on a publish that finds the app not settled yet; ``pause`` holds
    publishes to a RabbitMQ queue while ``priority-router migrate`` swaps it; with a
    ``consumer_check_interval`` above 0, publishes start the background check for workers
    blind to some priorities (``consumers.py``); on Redis, outside workers, they start the
    looks at the priority lists published to (``stranded.py``).
    """

    def __init__(
        self,
        app: Celery,
        decide: Decide,
        config: RouterConfig,
        settle: Settle,
        *,
        on_decision: Callable[[Decision], None] | None = None,
        pause: PublishPause | None = None,
        consumer_check_interval: float = 0,
    ) -> None:
        self._app = weakref.ref(app)
        self._decide = decide
        self._settle = settle
        self._on_decision = on_decision
        self._pause = pause
        self.use(config)
        #: Set by :meth:`settled` once the app's final configuration is known.
        self.transport: Transport | None = None
        #: The app's ``task_default_priority`` (a wire value), if it sets one.
        self.default_wire: int | None = None
        #: Why this app's publishes cannot be routed (logged once), if they cannot.
        self.unroutable: str | None = None
        #: Queues (routing keys) this process published documents to.
        self.queues_seen: set[str] = set()
        #: The check for blind workers, which publishes start; None when it is off.
        self.consumer_watch = (
            ConsumerWatch(app, self, consumer_check_interval) if consumer_check_interval > 0 else None
        )
        self._on_publish = self.consumer_watch.published if self.consumer_watch is not None else None
        #: The look at the Redis priority lists it published to (``stranded.py``); None in a worker.
        self.stranded_watch: StrandedWatch | None = StrandedWatch(app, self)

    def use(self, config: RouterConfig) -> None:
        """Take these settings (the router's, after it followed the app's configuration)."""
        self._patterns = config.tasks
        self._header = config.client_id_header
        self._kwarg = config.client_id_kwarg
        self._getter = config.client_id_getter
        self._cost_getter = config.cost_getter
        self._annotate = config.flower_kwargsrepr
        #: The table's name in Flower, when it is not the scheme's.
        self._table = None if config.thresholds == DEFAULT_THRESHOLDS else table_name(config.thresholds)
        self._default_priority = config.default_priority
        self.dry_run = config.dry_run
        self._inflight = config.mode == "inflight"

    def settled(self, transport: Transport, default_wire: int | None) -> None:
        """The app settled on ``transport``; ``default_wire`` is its ``task_default_priority``
        (None when it sets none)."""
        self.default_wire = default_wire
        self.transport = transport
        self.unroutable = None

    def refuse(self, reason: str) -> bool:
        """The app's publishes cannot be routed, for ``reason``: they go out as plain Celery
        sends them.  True when the reason is new (to be logged), False when it was given."""
        self.transport = None
        new = self.unroutable != reason
        self.unroutable = reason
        return new

    def in_worker(self) -> None:
        """The app runs a worker: its publishes no longer start the check for blind
        workers (workers do not inspect other workers), nor looks at the priority lists (a
        router worker polls every list of the queues it consumes)."""
        self._on_publish = None
        watch, self.stranded_watch = self.stranded_watch, None
        if watch is not None:
            watch.stop()

    def __call__(
        self,
        sender: str | None = None,
        body: Any = None,
        headers: dict[str, Any] | None = None,
        properties: dict[str, Any] | None = None,
        routing_key: str | None = None,
        exchange: object = None,
        declare: object = None,
        **_: Any,
    ) -> None:
        app = publishing_app.get()
        if app is None or app is not self._app() or headers is None or properties is None:
            return
        if republishing.get():
            return
        transport = self.transport
        if transport is None:
            if self.unroutable is not None:
                return
            transport = self._settle(app)
            if transport is None:
                return
        if transport is Transport.AMQP and self._pause is not None:
            self._pause.hold(exchange, routing_key, declare)
        chosen = self._chosen_wire(properties)
        try:
            decision = self.decide(sender or "", body, headers, chosen, transport)
        except Exception:
            logger.exception("priority-router could not route %s; using the default priority", sender)
            decision = Decision(None, None, self._default_priority, Reason.FAIL_OPEN)
        try:
            self._stamp(decision, headers, properties, chosen, transport)
        except Exception:
            logger.exception("priority-router could not stamp %s", sender)
            if not self.dry_run:
                properties.setdefault("priority", to_wire(self._default_priority, transport))
        if isinstance(routing_key, str):
            self.queues_seen.add(routing_key)
            watch = self.stranded_watch
            if watch is not None and transport is Transport.REDIS and not self.dry_run:
                watch.published(routing_key, properties.get("priority"))
        if self._on_publish is not None:
            self._on_publish()

    def decide(
        self,
        task_name: str,
        body: Any,
        headers: dict[str, Any],
        chosen: int | None,
        transport: Transport,
    ) -> Decision:
        """The decision for one publish; ``chosen`` is the caller's own wire priority, if any."""
        if not self._counts(task_name):
            return Decision(None, None, self._default_priority, Reason.NOT_COUNTED)
        decision = self._count_or_inherit(task_name, body, headers)
        if chosen is None:
            return decision
        reason, pending = decision.reason, decision.pending
        if reason is not Reason.INHERITED:
            # A count the store did not keep (this process's own, during an outage) is not shown.
            reason, pending = Reason.EXPLICIT, pending if reason is Reason.COUNTED else None
        return Decision(decision.client_id, pending, from_wire(chosen, transport), reason)

    def _chosen_wire(self, properties: dict[str, Any]) -> int | None:
        """The priority the caller put on the message, or None (the app default is no choice)."""
        wire = properties.get("priority")
        if isinstance(wire, bool) or not isinstance(wire, int) or wire == self.default_wire:
            return None
        return wire

    def _count_or_inherit(self, task_name: str, body: Any, headers: dict[str, Any]) -> Decision:
        client = self._client_id(task_name, body, headers)
        if headers.get("retries") and H.PRIORITY in headers:
            inherited = self._inherited_from_headers(headers)
            if inherited is not None:
                return inherited
        parent = self._parent_decision()
        if parent is not None and (client is None or client == parent.client_id):
            return parent
        if client is None:
            inherited = self._inherited_from_headers(headers)
            if inherited is not None:
                return inherited
            return Decision(None, None, self._default_priority, Reason.NO_CLIENT)
        cost = headers.get(H.COST)
        if cost is None and self._cost_getter is not None:
            cost = self._getter_cost(task_name, body, headers)
        if not self._inflight:
            return self._decide(client, None, cost)
        # Counted until confirmed: the sender confirms it once the broker took it (``sender.py``).
        return self._decide(client, _task_id(body, headers), cost, provisional=True)

    def _getter_cost(self, task_name: str, body: Any, headers: dict[str, Any]) -> object:
        args, kwargs = _args_kwargs(body)
        try:
            return self._cost_getter(task_name, args, kwargs, headers)  # type: ignore[misc]
        except Exception:
            logger.exception("cost_getter failed for %s; counting the document as 1", task_name)
            return None

    def _stamp(
        self,
        decision: Decision,
        headers: dict[str, Any],
        properties: dict[str, Any],
        chosen: int | None,
        transport: Transport,
    ) -> None:
        decision, wire = self._priced(decision, properties, chosen, transport)
        if self.dry_run:
            headers[H.DRY_RUN] = True
        else:
            self._apply(properties, headers, wire, transport)
        headers[H.REASON] = decision.reason._value_
        if decision.reason is Reason.NOT_COUNTED:
            return
        client = decision.client_id
        if client is not None and len(client) <= MAX_HEADER_ID:
            # AMQP puts all headers in one frame (128 KiB by default); RabbitMQ drops a
            # message whose headers overflow it, so a huge id stays where the user put it.
            headers[self._header] = client
        headers[H.PRIORITY] = decision.priority
        headers[H.PENDING] = decision.pending
        headers[H.PUBLISHED_AT] = time.time()
        if decision.tier is not None:
            headers[H.TIER] = decision.tier
        if decision.cost != 1 or H.COST in headers:
            # What was counted, which the worker's end gives back (a bad cost counted as 1).
            headers[H.COST] = decision.cost
        if self._inflight and decision.pending is not None and decision.reason in _IN_THE_STORE:
            headers[H.INFLIGHT] = True  # counted in the in-flight list: the worker ends it
        if self._annotate and isinstance(headers.get("kwargsrepr"), str):
            headers["kwargsrepr"] = annotate_kwargsrepr(
                headers["kwargsrepr"], decision, self.dry_run, self._table
            )
            event = sent_event(sending.get())
            if event is not None and "kwargs" in event:
                # Flower applies a task-sent event that arrives after task-received over it.
                event["kwargs"] = headers["kwargsrepr"]
        if self._on_decision is not None:
            self._on_decision(decision)

    def _priced(
        self, decision: Decision, properties: dict[str, Any], chosen: int | None, transport: Transport
    ) -> tuple[Decision, int | None]:
        """The decision as the headers show it, and the wire priority the message is to
        get (None: the one Celery put on it stays)."""
        current = properties.get("priority")
        if decision.reason is Reason.NOT_COUNTED:
            return decision, to_wire(decision.priority, transport) if current is None else None
        if chosen is not None:
            return decision, None  # the caller's priority goes out unchanged
        if (
            decision.reason is Reason.NO_CLIENT
            and self.default_wire is not None
            and current == self.default_wire
        ):
            # The app's task_default_priority is what Celery already put on the message.
            default = from_wire(self.default_wire, transport)
            return Decision(None, None, default, Reason.NO_CLIENT), None
        return decision, to_wire(decision.priority, transport)

    @staticmethod
    def _apply(
        properties: dict[str, Any], headers: dict[str, Any], wire: int | None, transport: Transport
    ) -> None:
        """Put the router's priority on the message (never in dry run)."""
        if transport is Transport.AMQP and headers.get("expires") is not None:
            # Celery also sends ``expires`` as the message's AMQP TTL.  With prefetch 1 the
            # message waits in RabbitMQ, which drops it unseen and leaves its result PENDING
            # forever; without the TTL the worker receives it and revokes it, as on Redis.
            properties.pop("expiration", None)
        if wire is not None:
            properties["priority"] = wire

    def _counts(self, task_name: str) -> bool:
        return self._patterns is None or any(fnmatch.fnmatchcase(task_name, p) for p in self._patterns)

    def _client_id(self, task_name: str, body: Any, headers: dict[str, Any]) -> str | None:
        client = normalize_client_id(headers.get(self._header))
        if client is not None:
            return client
        args, kwargs = _args_kwargs(body)
        return client_from_call(self._kwarg, self._getter, task_name, args, kwargs, headers)

    def _parent_decision(self) -> Decision | None:
        app = self._app()
        if app is None or not tasks_running():
            return None
        parent = app.current_worker_task
        if parent is None:
            return None
        request = parent.request
        return _inherited(
            getattr(request, H.PRIORITY, None),
            getattr(request, self._header, None),
            getattr(request, H.PENDING, None),
        )

    def _inherited_from_headers(self, headers: dict[str, Any]) -> Decision | None:
        return _inherited(headers.get(H.PRIORITY), headers.get(self._header), headers.get(H.PENDING))


#: The reasons of documents the store counted.
_IN_THE_STORE = (Reason.COUNTED, Reason.EXPLICIT)


def _inherited(priority: object, client: object, pending: object) -> Decision | None:
    """A parent's or an earlier attempt's decision, passed on; None without its priority."""
    if not is_priority(priority):
        return None
    if not isinstance(pending, int | float) or isinstance(pending, bool) or not math.isfinite(pending):
        pending = None
    return Decision(normalize_client_id(client), pending, priority, Reason.INHERITED)


def _task_id(body: Any, headers: dict[str, Any]) -> object:
    """The document's task id: protocol 2 keeps it in the headers, protocol 1 in the body."""
    task_id = headers.get("id")
    if task_id is None and isinstance(body, dict):
        task_id = body.get("id")
    return task_id


def _args_kwargs(body: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Task args and kwargs from a protocol 2 ``(args, kwargs, embed)`` or protocol 1 body."""
    args: Any = ()
    kwargs: Any = {}
    if isinstance(body, tuple | list) and len(body) >= 2:
        args, kwargs = body[0], body[1]
    elif isinstance(body, dict):
        args, kwargs = body.get("args", ()), body.get("kwargs", {})
    return (tuple(args) if isinstance(args, list | tuple) else (), kwargs if isinstance(kwargs, dict) else {})
