"""The queue a migration swaps: the app's definition of it as either kind, and the state
the broker holds it in, which is all a rerun needs to know where a run stopped.

RabbitMQ does not say which arguments a queue has; a declaration with other arguments
than the existing queue's is refused (``PRECONDITION_FAILED``) and changes nothing.  So
the queue's kind is found by declaring it as the target kind, then as the old kind, each
on a channel of its own, after a passive declare said it exists.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any

from celery import Celery

from ..errors import ConfigurationError, PriorityRouterError
from ..integration.brokers import AMQP_MAX_PRIORITY, Transport, to_wire
from ..integration.rabbitmq import channel_of, is_quorum, vhost_of
from ..router import installed_router
from .migration import Target

#: The holding queue's name is the queue's with this after it.
HOLDING_SUFFIX = ".priority-router-holding"
#: An exclusive queue of this name on the migrator's connection: one migration per queue.
LOCK_SUFFIX = ".priority-router-migrating"


class MigrationBlocked(PriorityRouterError):
    """The migration cannot go on; the message says why and what to do."""


class Kind(Enum):
    OLD = "old"
    TARGET = "target"
    MISSING = "missing"


@dataclass
class QueueSpec:
    """The queue as the app defines it, declared either way."""

    name: str
    vhost: str
    target: Any
    old: Any
    #: ``(exchange, routing key)`` pairs that route to it, the default exchange's first.
    routes: list[tuple[str, str]]
    #: The app's bindings of it, as kombu declares them.
    bindings: list[Binding]
    #: Wire priority given to a message that has none, moving into a priority queue.
    unpriced: int | None

    @property
    def holding(self) -> str:
        return self.name + HOLDING_SUFFIX


def queue_spec(app: Celery, name: str, target: Target) -> QueueSpec:
    try:
        defined = app.amqp.queues[name]
    except KeyError:  # task_create_missing_queues is off: Celery's layout for the name
        defined = app.amqp.queues.new_missing(name)
    if is_quorum(defined):
        raise ConfigurationError(
            f"queue {name!r}",
            "it is a quorum queue: RabbitMQ takes no x-max-priority on quorum queues and never changes "
            "a queue's type, so migrate cannot make it a priority queue (quorum queues honour "
            "priorities from RabbitMQ 4.0 on)",
            "on RabbitMQ 4.0 or later, leave it as it is; before 4.0, move its documents to a classic "
            "queue under a new name, or drain and delete it (the Brokers page of the docs, 'From a "
            "quorum queue to a priority queue')",
        )
    if defined.auto_delete or defined.exclusive:
        raise ConfigurationError(
            f"queue {name!r}",
            "it is an auto-delete or exclusive queue: it goes with its consumers, so it cannot be "
            "swapped under them",
            "stop its consumers; it is declared anew as their kind when they start",
        )
    own = (defined.queue_arguments or {}).get("x-max-priority") or defined.max_priority
    levels = int(own or AMQP_MAX_PRIORITY)
    priority, plain = _as_kind(defined, levels), _as_kind(defined, None)
    bindings = bindings_of(defined)
    routes = [("", name)] + [(b.exchange.name, b.routing_key) for b in bindings]
    router = installed_router(app)
    default = app.conf.task_default_priority
    unpriced = (
        int(default)
        if isinstance(default, int)
        else to_wire(router.config.default_priority if router is not None else 5, Transport.AMQP)
    )
    return QueueSpec(
        name,
        vhost_of(app),
        priority if target is Target.ROUTER else plain,
        plain if target is Target.ROUTER else priority,
        routes,
        bindings,
        unpriced if target is Target.ROUTER else None,
    )


def _as_kind(queue: Any, levels: int | None) -> Any:
    """``queue`` declared with ``levels`` priorities, or none (only its declaration is used:
    kombu's copy of a queue with ``bindings`` loses its exchange)."""
    clone = copy.copy(queue)
    args = {k: v for k, v in (queue.queue_arguments or {}).items() if k != "x-max-priority"}
    if levels is not None:
        args["x-max-priority"] = levels
    clone.queue_arguments = args or None
    clone.max_priority = None
    return clone


@dataclass(frozen=True)
class Binding:
    exchange: Any
    routing_key: str
    arguments: dict[str, Any] | None = None

    def __str__(self) -> str:
        shown = f"exchange {self.exchange.name!r} ({self.exchange.type}) with key {self.routing_key!r}"
        return shown + (f" and arguments {self.arguments}" if self.arguments else "")


def bindings_of(queue: Any) -> list[Binding]:
    """What kombu binds ``queue`` to when a worker declares it: its exchange with its routing
    key, and each of its ``bindings``."""
    found = []
    if queue.exchange is not None and queue.exchange.name:
        found.append(Binding(queue.exchange, queue.routing_key or "", queue.binding_arguments))
    for b in queue.bindings:
        if b.exchange is not None:
            found.append(Binding(b.exchange, b.routing_key or "", b.arguments))
    return found


@dataclass
class State:
    kind: Kind
    ready: int = 0
    consumers: int = 0
    #: Messages in the holding queue; None when there is none.
    holding: int | None = None

    def describe(self, spec: QueueSpec, target: Target) -> str:
        kinds = {
            Kind.OLD: f"is a {'plain' if target is Target.ROUTER else 'priority'} queue",
            Kind.TARGET: f"is already a {'priority' if target is Target.ROUTER else 'plain'} queue",
            Kind.MISSING: "does not exist",
        }
        text = f"{spec.name!r} (vhost {spec.vhost!r}) {kinds[self.kind]}"
        if self.kind is not Kind.MISSING:
            text += f" with {self.ready} message(s) ready and {self.consumers} consumer(s)"
        if self.holding is not None:
            text += f"; a migration was cut off: its holding queue holds {self.holding} message(s)"
        return text


def read_state(conn: Any, spec: QueueSpec) -> State:
    """What the broker holds: the queue's kind, depth and consumers, and the holding queue."""
    found = passive(conn, spec.name)
    holding = passive(conn, spec.holding)
    held = None if holding is None else holding[0]
    if found is None:
        return State(Kind.MISSING, holding=held)
    ready, consumers = found
    if accepts(conn, spec.target):
        return State(Kind.TARGET, ready, consumers, held)
    if accepts(conn, spec.old):
        return State(Kind.OLD, ready, consumers, held)
    raise ConfigurationError(
        f"queue {spec.name!r}",
        f"it exists on vhost {spec.vhost!r} with arguments that match neither the app's plain nor its "
        "priority declaration of it",
        "run the command with -A the app whose workers consume it, so its queue definition (arguments, "
        "durability) is the one used",
    )


def passive(conn: Any, name: str) -> tuple[int, int] | None:
    from amqp.exceptions import NotFound

    with channel_of(conn) as channel:
        try:
            ok = channel.queue_declare(queue=name, passive=True)
        except NotFound:
            return None
    return int(ok.message_count), int(ok.consumer_count)


def accepts(conn: Any, queue: Any) -> bool:
    """Whether the existing queue takes ``queue``'s declaration (same arguments)."""
    from amqp.exceptions import PreconditionFailed

    with channel_of(conn) as channel:
        try:
            queue.bind(channel).queue_declare()
        except PreconditionFailed:
            return False
    return True


@contextlib.contextmanager
def lock(conn: Any, spec: QueueSpec) -> Iterator[None]:
    from amqp.exceptions import ResourceLocked

    name = spec.name + LOCK_SUFFIX
    with channel_of(conn) as channel:
        try:
            channel.queue_declare(queue=name, exclusive=True, auto_delete=True)
        except ResourceLocked:
            raise MigrationBlocked(
                f"another `priority-router migrate {spec.name}` is running (its connection holds the "
                f"queue {name!r}); let it finish, or stop it and run this command again"
            ) from None
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                channel.queue_delete(queue=name)
