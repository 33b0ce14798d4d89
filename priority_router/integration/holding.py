"""Where a held document waits: in the broker, in a holding queue of its client's, with the
broker's durability (docs/caps.md).  The counter store only counts held documents; it
never keeps a message, so losing it loses no document.

- **Holding** publishes a received document's message, unchanged, to its client's holding
  queue (``<key_prefix>held.<client>``: a durable queue on RabbitMQ, with publisher
  confirms; a list on a Redis broker), with where it came from and its priority in
  headers; only then is the original acknowledged.  A holding queue is not a priority
  queue: the client's documents wait in the order they were held.
- **Releasing** takes the oldest message from the holding queue (unacknowledged), and
  once the counter store reserved its slot publishes it again where it first went, at its
  priority, then acknowledges the held copy.  A release that cannot start it puts it back
  at the front.
- **The index**: a holding queue that gains its first document adds its client to one
  more queue, ``<key_prefix>holding``, so that the workers find every holding queue again
  when the counter store lost the clients it knew (a restart, a failover, an eviction).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from celery import Celery
from kombu.connection import Connection
from kombu.entity import Queue
from kombu.messaging import Producer

from ..forks import renew_after_fork

logger = logging.getLogger("priority_router")

#: Headers a held copy carries: where the document goes when released, at what priority.
HELD_EXCHANGE = "priority_router_held_exchange"
HELD_ROUTING_KEY = "priority_router_held_routing_key"
HELD_PRIORITY = "priority_router_held_priority"
HELD_ID = "priority_router_held_id"
_HELD_HEADERS = (HELD_EXCHANGE, HELD_ROUTING_KEY, HELD_PRIORITY, HELD_ID)
#: The message properties a held document keeps.
KEPT_PROPERTIES = ("correlation_id", "reply_to")
#: The message properties a document is published with.
SENT_PROPERTIES = ("priority", "correlation_id", "reply_to", "delivery_mode")
#: Most index entries one look reads.
INDEX_BATCH = 1000
#: The longest holding-queue name used as is; a longer client id is replaced by a digest.
_NAME_BYTES = 200


def holding_queue_name(prefix: str, client_id: str) -> str:
    """The broker queue where ``client_id``'s held documents wait."""
    name = f"{prefix}held.{client_id}"
    if len(name.encode("utf-8", "surrogateescape")) <= _NAME_BYTES and name.isprintable():
        return name
    digest = hashlib.sha256(client_id.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return f"{prefix}held.sha256:{digest}"


def index_queue_name(prefix: str) -> str:
    """The broker queue that names the clients whose holding queues have documents."""
    return f"{prefix}holding"


@dataclass(frozen=True)
class Document:
    """A document's message as it was delivered: its body still serialized, where it went,
    and the properties a consumer reads."""

    body: bytes
    headers: dict[str, Any]
    content_type: str | None
    content_encoding: str | None
    exchange: str
    routing_key: str
    #: Those of :data:`SENT_PROPERTIES` the message has.
    properties: dict[str, Any]

    @classmethod
    def of(cls, message: Any) -> Document:
        """The document of a kombu ``message``."""
        body = message.body
        raw = body.encode("utf-8", "surrogateescape") if isinstance(body, str) else bytes(body)
        info = message.delivery_info or {}
        properties = message.properties or {}
        return cls(
            raw,
            dict(message.headers or {}),
            message.content_type,
            message.content_encoding,
            _name(info.get("exchange")),
            _name(info.get("routing_key")),
            {k: properties[k] for k in SENT_PROPERTIES if properties.get(k) is not None},
        )


class HoldingUnavailable(Exception):
    """The broker could not be reached for a holding queue (its connection or channel failed)."""


@dataclass
class Held:
    """A held document taken from its holding queue, not yet acknowledged there."""

    task_id: str
    cost: object
    message: Any
    holding: Holding

    def send(self, marks: Mapping[str, Any]) -> None:
        """Publish it again where it first went, with ``marks`` in its headers."""
        self.holding._send_back(self.message, marks)

    def drop(self) -> None:
        """Acknowledge the held copy: it is gone from the holding queue."""
        with self.holding._using():
            self.message.ack()

    def put_back(self) -> None:
        """Leave it held, at the front of its holding queue."""
        with self.holding._using():
            self.message.reject(requeue=True)


class Holding:
    """One process's holding queues on ``app``'s broker, on a connection of its own (each
    call is short and takes a lock, so threads may share it; a forked child opens its own)."""

    def __init__(self, app: Celery, prefix: str) -> None:
        self._app = app
        self._prefix = prefix
        self._lock = threading.RLock()
        self._connection: Connection | None = None
        self._channel: Any = None
        self._errors: tuple[type[BaseException], ...] | None = None
        renew_after_fork(self)

    def after_fork(self) -> None:
        """The parent's gate thread holds the lock across broker calls, and a child must not
        share the parent's socket: it starts with a free lock and connects on its own."""
        self._lock = threading.RLock()
        self._connection, self._channel = None, None

    def queue(self, client_id: str) -> Queue:
        return Queue(holding_queue_name(self._prefix, client_id), durable=True, auto_delete=False)

    def index(self) -> Queue:
        return Queue(index_queue_name(self._prefix), durable=True, auto_delete=False)

    def hold(self, message: Any, task_id: str, client_id: str, first: bool) -> None:
        """Publish ``message`` (a kombu message as the broker delivered it) to the client's
        holding queue, and name the client in the index when ``first``.  Raises what kombu
        raises: the caller then lets the document run."""
        self.hold_document(Document.of(message), task_id, client_id, first)

    def hold_document(self, document: Document, task_id: str, client_id: str, first: bool) -> None:
        """Publish ``document`` to the client's holding queue (as :meth:`hold`)."""
        properties = document.properties
        headers = {
            **document.headers,
            HELD_EXCHANGE: document.exchange,
            HELD_ROUTING_KEY: document.routing_key,
            HELD_PRIORITY: properties.get("priority"),
            HELD_ID: task_id,
        }
        kept = {k: properties[k] for k in KEPT_PROPERTIES if properties.get(k) is not None}
        with self._using() as channel:
            queue = self.queue(client_id)
            producer = Producer(channel)
            producer.publish(
                document.body,
                exchange="",
                routing_key=queue.name,
                headers=headers,
                content_type=document.content_type,
                content_encoding=document.content_encoding,
                delivery_mode=2,
                declare=[queue],
                retry=False,
                **kept,
            )
            if first:
                self._name_in_index(producer, client_id)

    def send_document(self, document: Document) -> None:
        """Publish ``document`` where it first went, at its priority, unchanged."""
        properties = {k: v for k, v in document.properties.items() if v is not None}
        properties.setdefault("delivery_mode", 2)
        with self._using() as channel:
            Producer(channel).publish(
                document.body,
                exchange=document.exchange,
                routing_key=document.routing_key,
                headers=document.headers,
                content_type=document.content_type,
                content_encoding=document.content_encoding,
                retry=False,
                **properties,
            )

    def take(self, client_id: str) -> Held | None:
        """The oldest document held for ``client_id``, unacknowledged; None when none is."""
        with self._using() as channel:
            try:
                message = self.queue(client_id)(channel).get(no_ack=False)
            except Exception as exc:
                if not _reopened_after_404(exc, self):
                    raise
                return None
        if message is None:
            return None
        headers = message.headers or {}
        task_id = headers.get(HELD_ID) or headers.get("id") or ""
        return Held(str(task_id), headers.get("priority_router_cost"), message, self)

    def count(self, client_id: str) -> int:
        """How many documents wait in ``client_id``'s holding queue."""
        return self.ready(self.queue(client_id).name)

    @contextmanager
    def indexed(self) -> Iterator[tuple[list[str], Callable[[list[str]], None]]]:
        """The index's entries, read once: yields (the distinct clients named, a function
        ``keep(clients)``) once; ``keep`` names those clients in the index again and drops
        the entries read.  Entries read but not settled go back when the connection does."""
        with self._lock:
            messages: list[Any] = []
            with self._using() as channel:
                index = self.index()(channel)
                index.declare()
                for _ in range(INDEX_BATCH):
                    message = index.get(no_ack=False)
                    if message is None:
                        break
                    messages.append(message)
            named = (_client_of_entry(message.body) for message in messages)
            clients = [client for client in dict.fromkeys(named) if client is not None]

            def keep(still: list[str]) -> None:
                with self._using() as channel:
                    producer = Producer(channel)
                    for client in still:
                        self._name_in_index(producer, client)
                    for message in messages:
                        message.ack()

            try:
                yield clients, keep
            except BaseException:
                self.close()  # the entries read go back to the index
                raise

    def close(self) -> None:
        with self._lock:
            connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            try:
                connection.close()
            except Exception:
                logger.debug("closing the holding queues' broker connection failed", exc_info=True)

    # -- the connection -------------------------------------------------------------

    @contextmanager
    def _using(self) -> Iterator[Any]:
        with self._lock:
            try:
                if self._channel is None:
                    self._connect()
                yield self._channel
            except Exception as exc:
                self.close()
                if isinstance(exc, self._broker_errors()):
                    raise HoldingUnavailable(f"{type(exc).__name__}: {exc}") from exc
                raise

    def _broker_errors(self) -> tuple[type[BaseException], ...]:
        """What the broker's transport raises when it cannot be reached."""
        if self._errors is None:
            with self._app.connection_for_write() as connection:  # builds no socket
                self._errors = (OSError, *connection.connection_errors, *connection.channel_errors)
        return self._errors

    def _connect(self) -> None:
        options: dict[str, Any] = {}
        if self._app.conf.broker_url and str(self._app.conf.broker_url).startswith(("amqp", "pyamqp")):
            # A held document's original is acknowledged only once the broker confirmed its copy.
            options["confirm_publish"] = True
        connection = self._app.connection_for_write(transport_options=options)
        connection.ensure_connection(max_retries=1)
        self._connection = connection
        self._channel = connection.channel()

    def ready(self, queue: str) -> int:
        """How many messages are ready in ``queue`` (0 when it does not exist)."""
        with self._using() as channel:
            try:
                _, ready, _ = channel.queue_declare(queue=queue, passive=True)
            except Exception as exc:
                # No such queue: nothing waits in it (kombu's Redis transport says so of an
                # empty queue too).
                if not _reopened_after_404(exc, self):
                    raise
                return 0
        return int(ready)

    def _name_in_index(self, producer: Producer, client_id: str) -> None:
        index = self.index()
        producer.publish(
            json.dumps(client_id).encode(),
            exchange="",
            routing_key=index.name,
            content_type="application/json",
            content_encoding="utf-8",
            delivery_mode=2,
            declare=[index],
            retry=False,
        )

    def _send_back(self, message: Any, marks: Mapping[str, Any]) -> None:
        headers = dict(message.headers or {})
        exchange, routing_key = headers.get(HELD_EXCHANGE, ""), headers.get(HELD_ROUTING_KEY, "")
        priority = headers.get(HELD_PRIORITY)
        for name in _HELD_HEADERS:
            headers.pop(name, None)
        properties = message.properties or {}
        kept = {k: properties[k] for k in KEPT_PROPERTIES if properties.get(k) is not None}
        if priority is not None:
            kept["priority"] = priority
        with self._using() as channel:
            Producer(channel).publish(
                message.body,
                exchange=exchange,
                routing_key=routing_key,
                headers={**headers, **marks},
                content_type=message.content_type,
                content_encoding=message.content_encoding,
                delivery_mode=properties.get("delivery_mode") or 2,
                retry=False,
                **kept,
            )


def _reopened_after_404(exc: Exception, holding: Holding) -> bool:
    """Whether ``exc`` says the queue does not exist; RabbitMQ then closed the channel, so a
    new one is opened."""
    if str(getattr(exc, "reply_code", None)) != "404":
        return False
    channel = holding._channel
    if channel is not None and not getattr(channel, "is_open", True):
        assert holding._connection is not None
        holding._channel = holding._connection.channel()
    return True


def _name(value: object) -> str:
    return value if isinstance(value, str) else ""


def _client_of_entry(body: object) -> str | None:
    try:
        client = json.loads(body)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return client if isinstance(client, str) and client else None
