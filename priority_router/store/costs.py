"""A document's cost: how much of its client's count one document takes.

Costs are counted in thousandths (:data:`RESOLUTION` units per cost 1) so that Redis adds
whole numbers and no sum drifts.  A client's documents are counted as before (the seed's
count, the in-flight list's length), and what costed documents add beyond 1 each is the
client's *extras*: in the seed mode a second key, ``<prefix>{token}:c`` (it shares the
client's hash tag and TTL); in the inflight mode one more entry at the oldest end of the
client's list, :func:`sentinel`, so a client costs one short list entry more rather than a
key.  Until a deployment counts its first costed document, no check reads or writes
extras, and the marker ``<prefix>costs-in-use`` says when one has.
"""

from __future__ import annotations

import math
import time

import redis

from ..errors import PriorityRouterError

#: Units per cost 1: costs are counted to the thousandth.
RESOLUTION = 1000
#: The largest cost a document may have (a 300-page scan is 300; an hour is 3,600 s).
MAX_COST = 1_000_000
#: A document of cost 1, in units.
ONE = RESOLUTION
#: Seconds a process keeps what it read of the costs-in-use marker.
MARKER_REFRESH = 5.0


class InvalidCost(PriorityRouterError, ValueError):
    """A cost that is not a positive finite number up to :data:`MAX_COST`."""


def cost_units(cost: object) -> int:
    """``cost`` in units; :class:`InvalidCost` naming the problem and the fix otherwise."""
    if isinstance(cost, bool):
        raise InvalidCost(f"cost {cost!r} is a truth value, not a number: give e.g. cost=30")
    if not isinstance(cost, int | float):
        try:
            cost = float(cost)  # type: ignore[arg-type]  # a header's "2.5"
        except (TypeError, ValueError):
            raise InvalidCost(
                f"cost {cost!r} is not a number: give a positive number of your unit "
                "(pages, megabytes, expected seconds), e.g. cost=30"
            ) from None
    if not math.isfinite(cost) or cost <= 0:
        raise InvalidCost(f"cost {cost!r} is not a positive finite number: a document costs more than 0")
    if cost > MAX_COST:
        raise InvalidCost(
            f"cost {cost!r} is above {MAX_COST:,}: scale your unit down (pages rather than bytes)"
        )
    units = round(cost * RESOLUTION)
    if units < 1:
        raise InvalidCost(f"cost {cost!r} is below {1 / RESOLUTION}, the smallest cost counted")
    return units


def as_count(units: int) -> int | float:
    """A count in units as the number users see: whole when it is whole."""
    whole, rest = divmod(units, RESOLUTION)
    return whole if rest == 0 else units / RESOLUTION


def pending_before(documents: int, extras: int) -> int | float:
    """The pending count a document is checked at: minus the costs before it, given the
    client's ``documents`` counted before it and their ``extras`` (units beyond 1 each)."""
    return as_count(-max(0, documents * RESOLUTION + extras))


def extras_value(raw: object) -> int:
    """An extras key's value as read (None: no key)."""
    return 0 if raw is None else int(raw)  # type: ignore[call-overload]


#: Starts the in-flight list's extras entry; 16 bytes, so no entry for a document (8 or 12
#: bytes, ``inflight.member``) is ever taken for it.
SENTINEL = b"priority-router="


def sentinel(extras: int) -> bytes:
    return SENTINEL + b"%d" % extras


def sentinel_extras(entry: object) -> int | None:
    """The extras an in-flight list's oldest entry holds; None when it is a document."""
    if isinstance(entry, bytes) and entry.startswith(SENTINEL):
        return int(entry[len(SENTINEL) :])
    return None


def costs_in_use_key(prefix: str) -> str:
    return f"{prefix}costs-in-use"


class CostsInUse:
    """Whether any costed document has been counted under the prefix, as this process last
    read it (at most every :data:`MARKER_REFRESH` seconds)."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._redis = client
        self.key = costs_in_use_key(prefix)
        self._known = False
        self._read_until = 0.0

    def __call__(self) -> bool:
        if self._known:
            return True  # once in use, always: the marker is never removed
        now = time.monotonic()
        if now >= self._read_until:
            self._read_until = now + MARKER_REFRESH
            # A failed read raises: the check it is part of fails at once, instead of
            # waiting for the store a second time in the same publish.
            self._known = bool(self._redis.exists(self.key))
        return self._known

    def mark(self) -> None:
        """Before the first costed check of this process: every publisher sees the marker
        within :data:`MARKER_REFRESH` seconds and starts reading the extras."""
        if not self._known:
            self._redis.set(self.key, "1")
            self._known = True
