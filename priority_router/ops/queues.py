"""How many messages wait in each of an app's queues, per priority where the broker says.

kombu's Redis transport keeps one list per priority step (``queue``, ``queue\\x06\\x161``,
... ``queue\\x06\\x169``), so the depth per level is exact.  RabbitMQ reports only a
queue's total depth; AMQP has no per-priority breakdown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from celery import Celery

from .. import headers as H
from ..integration.app_queues import queue_names
from ..integration.brokers import Transport, transport_of
from ..integration.celery_internals import step_list
from ..integration.celery_settings import REDIS_PRIORITY_STEPS
from .rabbitmq_queue import passive


@dataclass(frozen=True)
class QueueDepth:
    queue: str
    #: Messages waiting; None when the queue does not exist on the broker.
    ready: int | None
    #: Redis: waiting messages by wire priority step (0 = published without a priority).
    by_priority: dict[int, int] = field(default_factory=dict)
    #: RabbitMQ: consumers attached.
    consumers: int | None = None


@dataclass(frozen=True)
class BrokerDepths:
    transport: Transport
    queues: list[QueueDepth]
    #: Redis: messages delivered to workers and not yet acknowledged (all queues).
    unacked: int | None = None
    #: Redis: the priority steps this app's workers poll.
    polled_steps: list[int] = field(default_factory=list)

    def unpolled(self) -> dict[str, int]:
        """Redis: per queue, the messages waiting in lists this app's workers do not poll."""
        waiting = {
            q.queue: sum(n for step, n in q.by_priority.items() if step not in self.polled_steps)
            for q in self.queues
        }
        return {name: n for name, n in waiting.items() if n}


def queue_depths(app: Celery) -> BrokerDepths:
    transport = transport_of(app)
    names = queue_names(app)
    if transport is Transport.REDIS:
        return _redis_depths(app, names)
    if transport is Transport.AMQP:
        return _amqp_depths(app, names)
    return BrokerDepths(transport, [QueueDepth(n, None) for n in names])


def _redis_depths(app: Celery, names: list[str]) -> BrokerDepths:
    with app.connection_for_read() as conn:
        channel = conn.default_channel
        # Every list a router-side producer or this app's workers can use, whatever this
        # app's own steps: a worker without the router polls only 0, 3, 6 and 9.
        steps = sorted(set(channel.priority_steps) | set(REDIS_PRIORITY_STEPS))
        client = channel.client
        with client.pipeline(transaction=False) as pipe:
            for name in names:
                for step in steps:
                    pipe.llen(step_list(channel, name, step))
            pipe.hlen(channel.unacked_key)
            replies = pipe.execute()
    depths = []
    for i, name in enumerate(names):
        counts = replies[i * len(steps) : (i + 1) * len(steps)]
        by_step = {step: int(n) for step, n in zip(steps, counts, strict=True)}
        depths.append(QueueDepth(name, sum(by_step.values()), by_step))
    return BrokerDepths(
        Transport.REDIS, depths, unacked=int(replies[-1]), polled_steps=list(channel.priority_steps)
    )


def _amqp_depths(app: Celery, names: list[str]) -> BrokerDepths:
    depths = []
    with app.connection_for_read() as conn:
        for name in names:
            found = passive(conn, name)  # (ready, consumers), None when it does not exist
            depths.append(
                QueueDepth(name, None) if found is None else QueueDepth(name, found[0], consumers=found[1])
            )
    return BrokerDepths(Transport.AMQP, depths)


#: Messages of a queue's first list that :func:`unpriced_waiting` reads at most.
SAMPLE = 1000


def unpriced_waiting(app: Celery, names: list[str]) -> dict[str, int]:
    """Redis: per queue, the documents in its first list (step 0) that no router priced.

    ``max_wait`` moves overdue routed documents into that list too, so its length alone
    does not say; the oldest :data:`SAMPLE` messages (served next) are read and counted
    by their ``priority_router_reason`` header."""
    found: dict[str, int] = {}
    with app.connection_for_read() as conn:
        client = conn.default_channel.client
        for name in names:
            count = sum(1 for raw in client.lrange(name, -SAMPLE, -1) if not _priced(raw))
            if count:
                found[name] = count
    return found


def _priced(raw: bytes | str) -> bool:
    try:
        headers = json.loads(raw).get("headers") or {}
    except (ValueError, AttributeError):
        return False
    return isinstance(headers, dict) and H.REASON in headers
