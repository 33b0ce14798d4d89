"""Reading what really reached a broker."""

from __future__ import annotations

import time

from celery import Celery
from kombu import Message


def drain(app: Celery, queue_name: str, expected: int | None = None, timeout: float = 10) -> list[Message]:
    """Every message waiting in ``queue_name`` (removed), then the queue is deleted.

    With ``expected``, keep reading until that many arrived or ``timeout`` passed:
    RabbitMQ may still be routing the last publishes when the first ``basic.get`` runs.
    """
    messages = []
    deadline = time.monotonic() + timeout
    with app.connection_for_read() as conn:
        queue = app.amqp.queues[queue_name](conn.default_channel)
        while True:
            message = queue.get(no_ack=True)
            if message is not None:
                messages.append(message)
                continue
            if expected is None or len(messages) >= expected or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        queue.delete()
    return messages
