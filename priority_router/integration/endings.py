"""``mode="inflight"`` on the worker: the end of each counted document takes it off its
client's in-flight list.

A document counted at publish carries the ``priority_router_inflight`` header (a retry
copies it; a child task or an uncounted document has none).  Its end is whichever of
these the worker sees:

- ``task_postrun`` in the process that ran it (a prefork child, a thread, solo) with any
  state but ``RETRY``: success, failure, ``Ignore``, ``Reject``; a retry's final run ends
  it, and a ``Reject(requeue=True)`` does not (the message runs again and ends then);
- ``task_revoked`` (revoked, terminated, or expired before it ran);
- ``task_failure`` sent by the worker's main process for a document whose process was
  lost (``WorkerLostError``), rejected without requeue, or killed at its hard time limit
  (Celery reports a hard time limit twice, once without the request: that one is not
  an end).  Celery 5.7 puts the document's request on the task's stack for this signal;
  before 5.7 ``sender.request`` there is the main process's empty one, so the request is
  found by id among those this process received (``task_received``);
- ``task_unknown`` (no such task registered in this worker).

Each end is ``LREM`` of one entry of the document: it removes it at most once, so end
events seen twice and documents run twice after a redelivery are ended exactly once.  A
document whose worker was killed is redelivered (late acks) and ended when it finally
runs; an end lost for good (its message is gone) is cleared by the idle reset.  Reaching
Redis never breaks a task: a failure is logged once, and the store is then only probed in
the background until it answers, as for publishes.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from celery import Celery
from celery import states as S
from celery.exceptions import Reject, TimeLimitExceeded, WorkerLostError
from celery.signals import task_failure, task_postrun, task_received, task_revoked, task_unknown

from .. import headers as H
from ..decision import Reason
from ..store.client_ids import normalize_client_id
from . import celery_internals
from .gate import end_gated
from .installation import installed_engine

if TYPE_CHECKING:
    from ..engine import Engine

logger = logging.getLogger("priority_router")

_UID = "priority_router:endings"
#: Exceptions the worker's main process reports for documents ``task_postrun`` never saw end.
_LOST = (WorkerLostError, TimeLimitExceeded, Reject)

#: The counted documents this worker's main process holds, by task id: a request lives as
#: long as the worker holds its document, so an entry goes with it.
_received: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def watch_endings() -> None:
    """End the counted documents of every app with a router installed, on this worker
    (idempotent; an app's router is looked up at each end, :func:`installed_router`)."""
    task_postrun.connect(_on_postrun, dispatch_uid=_UID)
    task_revoked.connect(_on_revoked, dispatch_uid=_UID)
    task_failure.connect(_on_failure, dispatch_uid=_UID)
    task_unknown.connect(_on_unknown, dispatch_uid=_UID)
    task_received.connect(_on_received, dispatch_uid=_UID)


def end_document(
    router: Engine, fields: Any, task_id: object, app: Celery | None = None, unadmitted: bool = False
) -> bool:
    """End one document given its request (attributes) or headers (a mapping): free its
    slot if the gate admitted it (``gate.py``; with ``unadmitted``, also a released one the
    worker never admitted, as a revoked one), and if its publisher counted it in
    ``mode="inflight"`` take it off its client's list, whatever this worker's own mode (a
    mode switch rolls out in any order); True when this call ended it there.  Never raises."""
    if not isinstance(task_id, str) or not task_id:
        return False
    if app is not None and (unadmitted or _field(fields, H.GATED)):
        end_gated(app, router, _Fields(fields), task_id, unadmitted, request=fields if unadmitted else None)
    if not _field(fields, H.INFLIGHT):
        return False
    client = normalize_client_id(_field(fields, router.config.client_id_header))
    if client is None:
        return False
    return router.end_quietly(client, task_id, _field(fields, H.COST))


def end_unsent(app: Celery, message: Any) -> None:
    """A publish of ``app`` that raised (the broker refused the connection or the queue):
    end the document it counted (``mode="inflight"``), since no worker will.  A retry or a
    child task counted nothing of its own and is left alone.  Never raises."""
    router = installed_engine(app)
    headers = getattr(message, "headers", None)
    if router is None or not isinstance(headers, Mapping) or headers.get(H.REASON) == Reason.INHERITED:
        return
    task_id = headers.get("id")
    body = getattr(message, "body", None)
    if task_id is None and isinstance(body, Mapping):  # task protocol 1
        task_id = body.get("id")
    try:
        end_document(router, headers, task_id)
    except Exception:
        logger.exception("priority-router could not end the unsent document %s", task_id)


def confirm_sent(app: Celery, message: Any) -> None:
    """A publish of ``app`` the broker took: the document it counted (``mode="inflight"``)
    counts until a worker ends it (until confirmed, it stops counting 50 s after its
    count: its publisher may have been killed before sending it).  Never raises."""
    headers = getattr(message, "headers", None)
    if (
        not isinstance(headers, Mapping)
        or not headers.get(H.INFLIGHT)
        or headers.get(H.REASON) == Reason.INHERITED
    ):
        return
    router = installed_engine(app)
    if router is None:
        return
    client = normalize_client_id(headers.get(router.config.client_id_header))
    task_id = headers.get("id")
    body = getattr(message, "body", None)
    if task_id is None and isinstance(body, Mapping):  # task protocol 1
        task_id = body.get("id")
    if client is not None and isinstance(task_id, str):
        try:
            router.confirm_quietly(client, task_id, headers.get(H.COST))
        except Exception:  # the message is sent: nothing may make its publish raise now
            logger.exception("priority-router could not keep the confirm of document %s", task_id)


def _field(fields: Any, name: str) -> Any:
    return fields.get(name) if isinstance(fields, Mapping) else getattr(fields, name, None)


class _Fields(Mapping[str, Any]):
    """A request's fields read as a mapping, whether it is a request, a context or headers."""

    def __init__(self, fields: Any) -> None:
        self._fields = fields

    def __getitem__(self, name: str) -> Any:
        value = _field(self._fields, name)
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0


def _on_postrun(
    sender: Any = None,
    task_id: Any = None,
    task: Any = None,
    state: Any = None,
    retval: Any = None,
    **_: Any,
) -> None:
    if state == S.RETRY or task is None:
        return
    if state == S.REJECTED and isinstance(retval, Reject) and retval.requeue:
        return  # back in the queue: it ends when it runs again
    app = getattr(task, "app", None)
    router = installed_engine(app)
    if router is not None:
        end_document(router, task.request, task_id, app)


def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    router = installed_engine(app)
    if router is not None and request is not None:
        # Revoked on arrival, a released document never reached the gate: its slot goes.
        end_document(router, request, getattr(request, "id", None), app, unadmitted=True)


def _on_failure(sender: Any = None, task_id: Any = None, exception: Any = None, **_: Any) -> None:
    # An ordinary failure is ended by task_postrun in the process that ran it.
    if not isinstance(exception, _LOST) or (isinstance(exception, Reject) and exception.requeue):
        return
    app = getattr(sender, "app", None)
    router = installed_engine(app)
    if router is None:
        return
    request = getattr(sender, "request", None)
    if getattr(request, "id", None) != task_id:  # Celery before 5.7: not this document's
        received = _received.get(task_id) if isinstance(task_id, str) else None
        request = celery_internals.request_headers(received)
    if request is not None:
        end_document(router, request, task_id, app)


def _on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    headers = celery_internals.request_headers(request)
    if headers is not None and isinstance(request.id, str):
        _received[request.id] = request


def _on_unknown(sender: Any = None, id: Any = None, message: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    router = installed_engine(app)
    if router is not None and message is not None:
        end_document(router, getattr(message, "headers", None) or {}, id, app)
