"""The ``before_task_publish`` receiver that stamps each document with its priority.

``before_task_publish`` is process-wide and does not say which Celery app is
publishing, so :func:`mark_publishes` wraps one app's task sender to record it in a
context variable; the receiver acts only on publishes of the app it was installed on.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from celery import Celery

from . import headers as H
from .amqp_queues import demote_to_fifo, fifo_queue_in
from .decision import Decision, Reason
from .flower_repr import annotate_kwargsrepr
from .keys import normalize_client_id
from .wire import Transport, to_wire

if TYPE_CHECKING:
    from .router import PriorityRouter

logger = logging.getLogger("priority_router")

_publishing_app: ContextVar[Celery | None] = ContextVar("priority_router_app", default=None)
#: Set while a message already stamped is sent again (it must not be counted twice).
_republishing: ContextVar[bool] = ContextVar("priority_router_republishing", default=False)
_MARK = "__priority_router_marked__"
#: Longest client id copied into the message headers.
MAX_HEADER_ID = 1024


def mark_publishes(app: Celery) -> None:
    """Make ``app``'s task publishes identifiable to the receiver (idempotent)."""
    amqp = app.amqp
    send = amqp.send_task_message
    if getattr(send, _MARK, False):
        return

    @functools.wraps(send)
    def send_task_message(*args: Any, **kwargs: Any) -> Any:
        token = _publishing_app.set(app)
        try:
            return send(*args, **kwargs)
        except Exception as exc:
            queue = fifo_queue_in(exc)
            if queue is None:
                raise
            # The queue predates the router: publish into it as it is rather than fail.
            demote_to_fifo(app, queue)
            producer = args[0] if args else kwargs["producer"]
            producer.revive(producer.connection.channel())
            again = _republishing.set(True)
            try:
                return send(*args, **kwargs)
            finally:
                _republishing.reset(again)
        finally:
            _publishing_app.reset(token)

    setattr(send_task_message, _MARK, True)
    amqp.send_task_message = send_task_message


@contextlib.contextmanager
def publishing_as(app: Celery) -> Iterator[None]:
    """Run a block as if ``app`` were publishing (for calling the receiver directly)."""
    token = _publishing_app.set(app)
    try:
        yield
    finally:
        _publishing_app.reset(token)


class PublishReceiver:
    """Routes one app's publishes; connected to ``before_task_publish`` by ``install``."""

    def __init__(self, router: PriorityRouter, app: Celery, transport: Transport) -> None:
        self.router = router
        self.app = app
        self.transport = transport
        cfg = router.config
        self._patterns = cfg.tasks
        self._header = cfg.client_id_header
        self._kwarg = cfg.client_id_kwarg
        self._getter = cfg.client_id_getter
        self._annotate = cfg.flower_kwargsrepr
        self.on_decision: Callable[[Decision], None] | None = None

    def __call__(
        self,
        sender: str | None = None,
        body: Any = None,
        headers: dict[str, Any] | None = None,
        properties: dict[str, Any] | None = None,
        **_: Any,
    ) -> None:
        if _publishing_app.get() is not self.app or headers is None or properties is None:
            return
        if _republishing.get():
            return
        try:
            decision = self.decide(sender or "", body, headers)
        except Exception:
            logger.exception("priority-router could not route %s; using the default priority", sender)
            decision = Decision(None, None, self.router.config.default_priority, Reason.FAIL_OPEN)
        try:
            self._stamp(decision, headers, properties)
        except Exception:
            logger.exception("priority-router could not stamp %s", sender)
            properties["priority"] = to_wire(self.router.config.default_priority, self.transport)

    def decide(self, task_name: str, body: Any, headers: dict[str, Any]) -> Decision:
        default = self.router.config.default_priority
        if not self._counts(task_name):
            return Decision(None, None, default, Reason.NOT_COUNTED)
        client = self._client_id(task_name, body, headers)
        parent = self._parent_decision()
        if parent is not None and (client is None or client == parent.client_id):
            return parent
        if client is None:
            inherited = _inherited_from_headers(headers, self._header)
            if inherited is not None:
                return inherited
            return Decision(None, None, default, Reason.NO_CLIENT)
        if headers.get("retries") and H.PRIORITY in headers:
            return _inherited_from_headers(headers, self._header) or self.router.decide(client)
        return self.router.decide(client)

    def _stamp(self, decision: Decision, headers: dict[str, Any], properties: dict[str, Any]) -> None:
        if decision.reason is Reason.NOT_COUNTED:
            if properties.get("priority") is None:
                properties["priority"] = to_wire(decision.priority, self.transport)
            return
        client = decision.client_id
        if client is not None and len(client) <= MAX_HEADER_ID:
            # AMQP puts all headers in one frame (128 KiB by default); RabbitMQ drops a
            # message whose headers overflow it, so a huge id stays where the user put it.
            headers[self._header] = client
        headers[H.PRIORITY] = decision.priority
        headers[H.PENDING] = decision.pending
        headers[H.REASON] = decision.reason.value
        headers[H.PUBLISHED_AT] = time.time()
        properties["priority"] = to_wire(decision.priority, self.transport)
        if self._annotate and isinstance(headers.get("kwargsrepr"), str):
            headers["kwargsrepr"] = annotate_kwargsrepr(headers["kwargsrepr"], decision)
        if self.on_decision is not None:
            self.on_decision(decision)

    def _counts(self, task_name: str) -> bool:
        if self._patterns is None:
            return True
        return any(fnmatch.fnmatchcase(task_name, p) for p in self._patterns)

    def _client_id(self, task_name: str, body: Any, headers: dict[str, Any]) -> str | None:
        client = normalize_client_id(headers.get(self._header))
        if client is not None:
            return client
        args, kwargs = _args_kwargs(body)
        client = normalize_client_id(kwargs.get(self._kwarg))
        if client is not None or self._getter is None:
            return client
        try:
            return normalize_client_id(self._getter(task_name, args, kwargs, headers))
        except Exception:
            logger.exception("client_id_getter failed for %s; treating it as having no client", task_name)
            return None

    def _parent_decision(self) -> Decision | None:
        parent = self.app.current_worker_task
        if parent is None:
            return None
        request = parent.request
        priority = getattr(request, H.PRIORITY, None)
        if not isinstance(priority, int):
            return None
        client = normalize_client_id(getattr(request, self._header, None))
        pending = getattr(request, H.PENDING, None)
        return Decision(client, pending if isinstance(pending, int) else None, priority, Reason.INHERITED)


def _inherited_from_headers(headers: dict[str, Any], client_header: str) -> Decision | None:
    priority = headers.get(H.PRIORITY)
    if not isinstance(priority, int) or isinstance(priority, bool) or not 1 <= priority <= 9:
        return None
    pending = headers.get(H.PENDING)
    return Decision(
        normalize_client_id(headers.get(client_header)),
        pending if isinstance(pending, int) else None,
        priority,
        Reason.INHERITED,
    )


def _args_kwargs(body: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Task args and kwargs from a protocol 2 ``(args, kwargs, embed)`` or protocol 1 body."""
    args: Any = ()
    kwargs: Any = {}
    if isinstance(body, tuple | list) and len(body) >= 2:
        args, kwargs = body[0], body[1]
    elif isinstance(body, dict):
        args, kwargs = body.get("args", ()), body.get("kwargs", {})
    return (tuple(args) if isinstance(args, list | tuple) else (), kwargs if isinstance(kwargs, dict) else {})
