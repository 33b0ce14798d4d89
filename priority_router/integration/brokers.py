"""Logical priority (1 most urgent .. 9 least) to each broker's wire value.

kombu's Redis transport serves the lowest number first; RabbitMQ serves the
highest first (on queues declared with ``x-max-priority``).  This is the one
place that knows.
"""

from __future__ import annotations

from enum import Enum

from celery import Celery

from ..errors import ConfigurationError
from ..redact import redact_url
from ..thresholds import LEAST_URGENT, MOST_URGENT, is_priority


class Transport(str, Enum):
    """The brokers whose message priorities the router drives."""

    REDIS = "redis"
    AMQP = "amqp"
    #: kombu's in-memory transport (tests): accepted, but it has no priorities.
    MEMORY = "memory"

    @classmethod
    def from_driver(cls, driver_type: str, broker_url: str = "") -> Transport:
        """The transport of a kombu driver type; :class:`ConfigurationError` for a broker
        without priorities the router can drive."""
        try:
            return cls(driver_type)
        except ValueError:
            raise ConfigurationError(
                "broker_url",
                f"transport {driver_type!r} ({redact_url(broker_url)}) has no message priorities "
                "priority-router can drive",
                "use a Redis (redis://, rediss://, sentinel://) or AMQP/RabbitMQ (amqp://) broker",
            ) from None


#: The highest wire value used on AMQP; queues need ``x-max-priority`` >= this.
AMQP_MAX_PRIORITY = 10


def to_wire(logical: int, transport: Transport) -> int:
    """The message ``priority`` property for a logical priority on ``transport``."""
    if not is_priority(logical):
        raise ValueError(f"logical priority {logical!r} is outside 1..9")
    if transport is Transport.AMQP:
        return AMQP_MAX_PRIORITY - logical
    return logical


def from_wire(wire: int, transport: Transport) -> int:
    """The logical priority a wire value stands for: the inverse of :func:`to_wire`, clamped
    to 1..9 (a caller's own ``priority=`` may lie outside the router's range, e.g. 0 on
    Redis or 255 on RabbitMQ)."""
    logical = AMQP_MAX_PRIORITY - wire if transport is Transport.AMQP else wire
    return min(LEAST_URGENT, max(MOST_URGENT, logical))


def transport_of(app: Celery) -> Transport:
    """The broker transport ``app`` writes to; ConfigurationError when it has no priorities."""
    url = app.conf.broker_write_url or app.conf.broker_url or "amqp://"
    try:
        with app.connection_for_write() as conn:
            driver = conn.transport.driver_type
    except Exception as exc:
        raise ConfigurationError(
            "broker_url",
            f"cannot load the transport for {redact_url(str(url))} ({exc})",
            "use a Redis (redis://) or RabbitMQ (amqp://) broker URL",
        ) from None
    return Transport.from_driver(driver, str(url))
