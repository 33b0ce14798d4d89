"""Moving the messages of one RabbitMQ queue into another, each exactly once.

A batch of messages is fetched (``basic.get``), published to the other queue through the
default exchange and acknowledged, all inside one AMQP transaction (``tx.select``): the
broker applies the publishes and the acknowledgements of a batch together at
``tx.commit``, or, if the mover dies first, neither (its channel closes, the publishes
are discarded and the fetched messages go back to their queue, in their place).
Publisher confirms alone would leave a message in both queues when the mover dies between
the confirm and the acknowledgement.

Before committing, a passive declare of the destination, answered in order after the
batch's publishes, makes sure none of them came back unroutable (``mandatory``): then the
transaction is rolled back instead, and nothing moved.

Each message keeps its body and every property (headers, priority, correlation id,
delivery mode, content type and encoding, expiration...), unless ``reprice`` (given the
properties, changing them in place) says it changed them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from amqp import Message

#: Messages per transaction: one commit per batch.
BATCH = 200


@dataclass(frozen=True)
class Moved:
    moved: int
    #: Of those, the messages whose properties ``reprice`` changed.
    priced: int


class Unroutable(RuntimeError):
    """A moved message came back: the destination queue has gone."""


def move(
    conn: Any,
    source: str,
    dest: str,
    reprice: Callable[[dict[str, Any]], bool] | None,
    after_batch: Callable[[int], None],
    in_batch: Callable[[int], None],
) -> Moved:
    """Move every message waiting in ``source`` into ``dest`` (messages published to
    ``source`` meanwhile too); returns how many moved.  ``conn`` is a kombu Connection;
    ``after_batch(moved so far)`` runs after each committed batch, ``in_batch(n)`` after
    the n-th message of a batch is published and acknowledged, before the commit."""
    channel = conn.channel()
    channel.auto_decode = False  # the body as it arrived, bytes, whatever its encoding
    returned: list[object] = []
    channel.events["basic_return"].add(lambda *args: returned.append(args))
    moved = priced = 0
    try:
        channel.tx_select()
        while True:
            batch, batch_priced = _batch(channel, source, dest, reprice, in_batch)
            if not batch:
                break
            channel.queue_declare(queue=dest, passive=True)
            if returned:
                channel.tx_rollback()
                raise Unroutable(f"messages moved into {dest!r} came back unroutable: it no longer exists")
            channel.tx_commit()
            moved += batch
            priced += batch_priced
            after_batch(moved)
    finally:
        channel.close()
    return Moved(moved, priced)


def _batch(
    channel: Any,
    source: str,
    dest: str,
    reprice: Callable[[dict[str, Any]], bool] | None,
    in_batch: Callable[[int], None],
) -> tuple[int, int]:
    count = priced = 0
    while count < BATCH:
        message = channel.basic_get(queue=source, no_ack=False)
        if message is None:
            break
        properties = dict(message.properties)
        if reprice is not None and reprice(properties):
            priced += 1
        channel.basic_publish(
            Message(message.body, **properties), exchange="", routing_key=dest, mandatory=True
        )
        channel.basic_ack(message.delivery_tag)
        count += 1
        in_batch(count)
    return count, priced
