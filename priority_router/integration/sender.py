"""The one patch priority-router makes to a Celery app: a wrapper around its task sender.

Why it exists:

- ``before_task_publish`` is process-wide and does not say which app is publishing.
  The wrapper records the app in a context variable, so a router installed on one app
  leaves every other app in the process alone.
- RabbitMQ refuses to publish to a queue that exists without ``x-max-priority`` when
  the app declares it with one, and the other way round (``PRECONDITION_FAILED``).
  ``redeclares(app, queue)`` then declares the queue as it exists, if it can, and the
  wrapper sends the document once more (``rabbitmq.demote_to_fifo``, or in dry run
  ``rabbitmq.follow_priority_queue``); otherwise the
  refusal reaches the caller as in plain Celery.
- A send that raises (a broker refusing the connection or the queue) counted its document
  all the same, in ``before_task_publish``; ``unsent(app, message)`` is called before the
  error reaches the caller, so that no worker's end is waited for (``endings.py``).  A send
  that returns calls ``taken(app, message)``: the broker has the document, which counts until
  a worker ends it (a publisher killed in between never says so, and its count lapses).

Celery builds its sender lazily: ``app.amqp.send_task_message`` is a cached property
whose builder (``_create_task_sender``) freezes the publish retry policy, delivery mode,
serializer, compression and default routing key at the first publish.  The wrapper
goes around the *builder*, so the sender is built at the same moment as in plain Celery,
from the configuration the app has by then, and ``on_build`` runs at that moment too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from celery import Celery

from .celery_internals import SENDER, SENDER_BUILDER, sender_builder
from .rabbitmq import fifo_queue_in

publishing_app: ContextVar[Celery | None] = ContextVar("priority_router_app", default=None)
#: Set while a message already stamped is sent again (it must not be counted twice).
republishing: ContextVar[bool] = ContextVar("priority_router_republishing", default=False)
#: The task message Celery is sending (its headers, properties, body and ``task-sent`` event).
sending: ContextVar[Any] = ContextVar("priority_router_message", default=None)

_WRAPPED = "_priority_router_wrapped"


def wrap_sender(
    app: Celery,
    on_build: Callable[[Celery], object],
    redeclares: Callable[[Celery, str], bool],
    unsent: Callable[[Celery, Any], object],
    taken: Callable[[Celery, Any], object],
) -> None:
    """Wrap ``app``'s task sender (idempotent); ``on_build(app)`` runs when Celery
    builds it, or now if Celery already has; ``unsent(app, message)`` when a send raises,
    ``taken(app, message)`` when it returns."""
    amqp = app.amqp
    if amqp.__dict__.get(_WRAPPED):
        return
    built = amqp.__dict__.get(SENDER)
    if built is not None:
        on_build(app)
        amqp.__dict__[SENDER] = _wrap(app, built, redeclares, unsent, taken)
    else:
        build = sender_builder(amqp)

        def create_task_sender() -> Callable[..., Any]:
            on_build(app)
            return _wrap(app, build(), redeclares, unsent, taken)

        amqp.__dict__[SENDER_BUILDER] = create_task_sender
    amqp.__dict__[_WRAPPED] = True


def unwrap_sender(app: Celery) -> None:
    """Undo :func:`wrap_sender`: ``app`` publishes exactly as plain Celery does."""
    amqp = app.amqp
    if not amqp.__dict__.pop(_WRAPPED, False):
        return
    amqp.__dict__.pop(SENDER_BUILDER, None)
    sender = amqp.__dict__.get(SENDER)
    original = getattr(sender, "__wrapped__", None)
    if original is not None:
        amqp.__dict__[SENDER] = original


def _wrap(
    app: Celery,
    send: Callable[..., Any],
    redeclares: Callable[[Celery, str], bool],
    unsent: Callable[[Celery, Any], object],
    taken: Callable[[Celery, Any], object],
) -> Callable[..., Any]:
    def send_or_demote(*args: Any, **kwargs: Any) -> Any:
        try:
            return send(*args, **kwargs)
        except Exception as exc:
            queue = fifo_queue_in(exc)
            if queue is None or not redeclares(app, queue):
                raise
            producer = args[0] if args else kwargs["producer"]
            producer.revive(producer.connection.channel())
            again = republishing.set(True)
            try:
                return send(*args, **kwargs)
            finally:
                republishing.reset(again)

    @functools.wraps(send)
    def send_task_message(*args: Any, **kwargs: Any) -> Any:
        # Celery calls it as send_task_message(producer, name, message, **options).
        message = args[2] if len(args) > 2 else kwargs.get("message")
        token, sent = publishing_app.set(app), sending.set(message)
        try:
            result = send_or_demote(*args, **kwargs)
        except Exception:
            unsent(app, message)
            raise
        else:
            taken(app, message)
            return result
        finally:
            sending.reset(sent)
            publishing_app.reset(token)

    return send_task_message
