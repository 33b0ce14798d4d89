"""A held document's message: kept in the counter store as the broker delivered it, and
published again when the gate releases it (``gate.py``), unchanged but for the gate's mark.

The stored form is JSON: the body (base64, still serialized and compressed as it came),
its content type and encoding, the headers, the properties a consumer reads (priority,
correlation id, reply-to, delivery mode) and the exchange and routing key it was
published with.  Publishing it again goes through kombu's producer, not Celery's
``send_task``: no publish signal fires, so the document is neither counted again nor
given a new priority; it keeps its task id, its priority and its place in any canvas.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from celery import Celery

#: The message properties kept with a held document.
KEPT_PROPERTIES = ("priority", "correlation_id", "reply_to", "delivery_mode")


class Unstorable(ValueError):
    """A message whose headers cannot be kept as JSON (a custom transport's types)."""


def pack(message: Any) -> bytes:
    """The stored form of a kombu ``message``; :class:`Unstorable` when it has none."""
    body = message.body
    raw = body.encode("utf-8", "surrogateescape") if isinstance(body, str) else bytes(body)
    properties = message.properties or {}
    info = message.delivery_info or {}
    stored = {
        "body": base64.b64encode(raw).decode("ascii"),
        "content_type": message.content_type,
        "content_encoding": message.content_encoding,
        "headers": message.headers or {},
        "properties": {k: properties[k] for k in KEPT_PROPERTIES if properties.get(k) is not None},
        "exchange": info.get("exchange") or "",
        "routing_key": info.get("routing_key") or "",
    }
    try:
        return json.dumps(stored, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise Unstorable(f"its headers cannot be stored as JSON: {exc}") from None


def publish(app: Celery, packed: bytes, marks: Mapping[str, Any] | None = None) -> None:
    """Publish a stored message again, to the exchange and routing key it first went to,
    with ``marks`` added to its headers."""
    stored = json.loads(packed)
    with app.producer_or_acquire() as producer:
        producer.publish(
            base64.b64decode(stored["body"]),
            exchange=stored["exchange"],
            routing_key=stored["routing_key"],
            headers={**stored["headers"], **(marks or {})},
            content_type=stored["content_type"],
            content_encoding=stored["content_encoding"],
            retry=True,
            **stored["properties"],
        )
