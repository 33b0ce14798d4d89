"""Installing a router on a Celery app, whatever order the app is configured in.

``install(app)`` reads nothing of the app's configuration.  The settings priorities need,
the broker transport and the queues are worked out from the configuration the app
finally has ("settling"), at each of these moments:

- when Celery loads or reloads the configuration (``app.on_after_configure``; at once if
  the app is already configured);
- when Celery builds the app's task sender, right before its first publish;
- when a worker starts (``celeryd_init``, before the worker reads its settings, and
  ``worker_init``, for workers started from code).

A setting the user chose is kept and a warning names its cost, once.  A broker the
router cannot drive is refused at once if it is known at ``install()``; when it is only
known later, the router says so once, loudly, and leaves that app's publishes alone.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any

from celery import Celery
from celery.signals import before_task_publish, celeryd_init, task_received, worker_init

from .. import headers as H
from ..errors import ConfigurationError
from .brokers import Transport, transport_of
from .celery_settings import apply_priority_settings
from .consumers import ConsumerWatch
from .publish import PublishReceiver
from .rabbitmq import QUORUM_PRIORITIES, check_worker_queues, prepare_priority_queues
from .sender import publishing_app, unwrap_sender, wrap_sender

if TYPE_CHECKING:
    from ..router import PriorityRouter

logger = logging.getLogger("priority_router")

_installed: weakref.WeakKeyDictionary[Celery, PublishReceiver] = weakref.WeakKeyDictionary()
_watches: weakref.WeakKeyDictionary[Celery, ConsumerWatch] = weakref.WeakKeyDictionary()
_warned: weakref.WeakKeyDictionary[Celery, set[str]] = weakref.WeakKeyDictionary()
_lock = threading.RLock()
_UID = "priority_router"


def install(router: PriorityRouter, app: Celery) -> PublishReceiver:
    with _lock:
        existing = _installed.get(app)
        if existing is not None:
            if existing.router is router:
                return existing
            raise ConfigurationError(
                "install",
                f"{app!r} already has another PriorityRouter installed",
                "install one router per app, or call uninstall(app) on the other first",
            )
        receiver = PublishReceiver(router, app, settle)
        _installed[app] = receiver
        _warned[app] = set()
        interval = router.config.consumer_check_interval
        if interval > 0:
            watch = ConsumerWatch(app, receiver.queues_seen, interval)
            _watches[app] = watch
            receiver.on_publish = watch.published
        _connect_signals()
        app.on_after_configure.connect(_on_configure, weak=False, dispatch_uid=_UID)
        wrap_sender(app, _on_sender_built)
        if app.configured:
            try:
                _settle(app, receiver)
            except ConfigurationError:
                uninstall(router, app)
                raise
        return receiver


def uninstall(router: PriorityRouter, app: Celery) -> bool:
    """Undo :func:`install`; False when ``router`` was not installed on ``app``."""
    with _lock:
        receiver = _installed.get(app)
        if receiver is None or receiver.router is not router:
            return False
        del _installed[app]
        watch = _watches.pop(app, None)
        if watch is not None:
            watch.stop()
        app.on_after_configure.disconnect(dispatch_uid=_UID)
        unwrap_sender(app)
        return True


def receiver_of(app: Celery) -> PublishReceiver | None:
    return _installed.get(app)


def settle(app: Celery, receiver: PublishReceiver) -> Transport | None:
    """Settle for the configuration ``app`` has now; None (said once) when it cannot be routed."""
    try:
        return _settle(app, receiver)
    except ConfigurationError as exc:
        _unroutable(app, receiver, exc)
        return None


def _settle(app: Celery, receiver: PublishReceiver) -> Transport:
    transport = transport_of(app)
    warned = _warned.setdefault(app, set())
    apply_priority_settings(app, transport, warned)
    if transport is Transport.AMQP:
        quorum = prepare_priority_queues(app)
        if quorum and "quorum" not in warned:
            warned.add("quorum")
            logger.warning(
                "priority-router: queues %s are quorum queues. %s", ", ".join(quorum), QUORUM_PRIORITIES
            )
    elif transport is Transport.MEMORY and "memory" not in warned:
        warned.add("memory")
        logger.warning("the memory:// broker has no priorities; documents are counted but run in order")
    default = app.conf.task_default_priority
    receiver.default_wire = int(default) if str(default).isdigit() else None
    receiver.transport = transport
    receiver.unroutable = None
    watch = _watches.get(app)
    if watch is not None:
        watch.transport = transport
    return transport


def _unroutable(app: Celery, receiver: PublishReceiver, exc: ConfigurationError) -> None:
    receiver.transport = None
    message = str(exc)
    if receiver.unroutable != message:
        logger.error(
            "priority-router cannot route the publishes of %r, so they go out as plain Celery sends them: %s",
            app,
            message,
        )
    receiver.unroutable = message


# -- the moments the configuration is settled ------------------------------------------


def _on_configure(sender: Celery | None = None, **_: Any) -> None:
    receiver = _installed.get(sender) if sender is not None else None
    if sender is not None and receiver is not None:
        settle(sender, receiver)


def _on_sender_built(app: Celery) -> None:
    receiver = _installed.get(app)
    if receiver is not None:
        settle(app, receiver)


def _on_worker_starting(sender: Any = None, instance: Any = None, **_: Any) -> None:
    app = getattr(instance, "app", None)
    receiver = _installed.get(app) if app is not None else None
    if receiver is not None:
        _settle_worker(app, receiver)


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    receiver = _installed.get(app) if app is not None else None
    if app is None or receiver is None:
        return
    transport = _settle_worker(app, receiver)
    wanted = app.conf.worker_prefetch_multiplier
    if getattr(sender, "prefetch_multiplier", wanted) != wanted:
        # The worker read its settings before this point (workers started from code
        # send no celeryd_init); the consumer is built from this attribute later.
        sender.prefetch_multiplier = int(wanted)
    if transport is Transport.AMQP:
        check_worker_queues(app, prepare_priority_queues(app))


def _settle_worker(app: Celery, receiver: PublishReceiver) -> Transport:
    receiver.in_worker = True
    receiver.on_publish = None  # workers do not inspect other workers
    try:
        return _settle(app, receiver)
    except ConfigurationError as exc:
        logger.critical("priority-router: %s", exc)
        raise SystemExit(f"priority-router: {exc}") from None


def _on_publish(**kwargs: Any) -> None:
    app = publishing_app.get()
    if app is None:
        return
    receiver = _installed.get(app)
    if receiver is not None:
        receiver(**kwargs)


def _on_task_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    app = getattr(request, "app", None)
    receiver = _installed.get(app) if app is not None else None
    if receiver is None:
        return
    warned = _warned.setdefault(app, set())
    if "unpriced" in warned:
        return
    headers = getattr(request, "request_dict", None) or {}
    if H.REASON in headers:
        return
    warned.add("unpriced")
    queue = (getattr(request, "delivery_info", None) or {}).get("routing_key")
    logger.warning(
        "priority-router: task %s (id %s) arrived on queue %r without a priority-router decision: "
        "the process that published it has no router installed, so its documents carry no client "
        "priority and are served in arrival order. Fix: install the router in the publishing app "
        "too (PriorityRouter(...).install(app) where that Celery app is created)",
        getattr(request, "name", "?"),
        getattr(request, "id", "?"),
        queue,
    )


_connected = False


def _connect_signals() -> None:
    global _connected
    if _connected:
        return
    before_task_publish.connect(_on_publish, dispatch_uid=_UID)
    celeryd_init.connect(_on_worker_starting, dispatch_uid=_UID)
    worker_init.connect(_on_worker_init, dispatch_uid=_UID)
    task_received.connect(_on_task_received, dispatch_uid=_UID)
    _connected = True
