"""RabbitMQ queues that can honour priorities, and the checks that say when one cannot.

RabbitMQ ignores message priorities on a queue declared without ``x-max-priority``,
and refuses to redeclare an existing queue with other arguments
(``PRECONDITION_FAILED``).  A worker that ignored that would serve FIFO silently.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from celery import Celery

from .errors import ConfigurationError
from .wire import AMQP_MAX_PRIORITY

logger = logging.getLogger("priority_router")


class QueueNotPriorityError(ConfigurationError):
    """An existing RabbitMQ queue was declared without ``x-max-priority``."""

    def __init__(self, queue: str, detail: str) -> None:
        super().__init__(
            f"queue {queue!r}",
            f"it already exists on RabbitMQ with other arguments than x-max-priority="
            f"{AMQP_MAX_PRIORITY}, so RabbitMQ cannot apply priorities to it ({detail})",
            f"either delete it once it is drained (rabbitmqctl delete_queue {queue}) so it is "
            f"redeclared as a priority queue, or route documents to a new queue name "
            f"(task_default_queue / task_queues)",
        )
        self.queue = queue


def make_priority_queues(app: Celery) -> None:
    """Give every queue the app declares ``x-max-priority`` unless the user set one."""
    queues = app.amqp.queues
    if queues.max_priority is None:
        queues.max_priority = AMQP_MAX_PRIORITY  # for queues created later by name
    for queue in queues.values():
        args = dict(queue.queue_arguments or {})
        if "x-max-priority" not in args:
            args["x-max-priority"] = AMQP_MAX_PRIORITY
            queue.queue_arguments = args
        elif args["x-max-priority"] < AMQP_MAX_PRIORITY:
            logger.warning(
                "queue %r keeps your x-max-priority=%r (priority-router uses up to %d): "
                "the most urgent levels share its top priority",
                queue.name,
                args["x-max-priority"],
                AMQP_MAX_PRIORITY,
            )
        if (queue.queue_arguments or {}).get("x-queue-type") == "quorum":
            warn_quorum(queue.name)


def warn_quorum(name: str) -> None:
    logger.warning(
        "queue %r is a quorum queue: RabbitMQ quorum queues know only two priorities "
        "(0-4 normal, 5+ high) and serve high to normal about 2:1 rather than strictly, so "
        "logical priorities 1-5 share one level and 6-9 another; use a classic queue for "
        "full priority ordering",
        name,
    )


_INEQUIVALENT = re.compile(r"inequivalent arg 'x-max-priority' for queue '(?P<queue>.*?)' in vhost")
_demoted: set[tuple[int, str]] = set()


def fifo_queue_in(exc: BaseException) -> str | None:
    """The queue name when ``exc`` is RabbitMQ refusing to add ``x-max-priority`` to it."""
    from amqp.exceptions import PreconditionFailed

    if not isinstance(exc, PreconditionFailed):
        return None
    match = _INEQUIVALENT.search(str(exc))
    return match.group("queue") if match else None


def demote_to_fifo(app: Celery, queue_name: str) -> None:
    """Declare ``queue_name`` as it exists (no ``x-max-priority``) from now on, so
    publishing to it keeps working; say once, loudly, that it serves FIFO."""
    queue = app.amqp.queues.get(queue_name)
    if queue is not None:
        args = dict(queue.queue_arguments or {})
        args.pop("x-max-priority", None)
        queue.queue_arguments = args or None
    if (id(app), queue_name) not in _demoted:
        _demoted.add((id(app), queue_name))
        logger.error(
            "priority-router: %s. Until then documents published to it are delivered "
            "without priority ordering (workers installed with the router refuse to consume it)",
            QueueNotPriorityError(queue_name, "PRECONDITION_FAILED on publish"),
        )


def verify_priority_queues(app: Celery, create: bool = True) -> list[str]:
    """Declare each queue the app uses; raise :class:`QueueNotPriorityError` on the first
    that exists without matching priority arguments.  Returns the queue names checked.

    With ``create=False`` a queue that does not exist yet is left uncreated (and unlisted).
    """
    from amqp.exceptions import NotFound, PreconditionFailed

    checked = []
    with app.connection_for_write() as conn:
        for queue in app.amqp.queues.values():
            channel = conn.channel()
            try:
                if not create:
                    try:
                        channel.queue_declare(queue=queue.name, passive=True)
                    except NotFound:
                        continue
                    channel = conn.channel()  # a failed passive declare closes the channel
                queue.bind(channel).declare()
            except PreconditionFailed as exc:
                raise QueueNotPriorityError(queue.name, str(exc)) from None
            finally:
                try:
                    channel.close()
                except Exception:
                    logger.debug("closing a channel after a failed declare", exc_info=True)
            checked.append(queue.name)
    return checked


def stop_worker_on_fifo_queue(app: Celery) -> Callable[..., None]:
    """A ``worker_init`` receiver that refuses to start ``app``'s worker on a queue
    RabbitMQ would serve in arrival order."""

    def on_worker_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        try:
            verify_priority_queues(app)
        except QueueNotPriorityError as exc:
            logger.critical("priority-router: %s", exc)
            # Signal receivers' exceptions are only logged by Celery; SystemExit is not.
            raise SystemExit(f"priority-router: {exc}") from None

    return on_worker_init
