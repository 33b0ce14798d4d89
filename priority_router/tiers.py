"""Per-client tiers: how one client's count turns into a priority, set at run time.

A tier adjusts the threshold table for one client (or, as the default tier, for every
client without one of its own):

- ``weight``: each document counts ``1/weight``; the pending count is divided by the
  weight (rounded toward 0) before the table is read, so a weight-2 client drops a level
  half as fast;
- ``shift``: the table's priority moved by whole levels, kept within 1..9 (``-1``: one
  level more urgent, a paid tier);
- ``fixed``: one priority for every document, whatever the count (an internal client
  always at 1, an abusive one at 9); weight and shift then do nothing and are refused;
- ``limits``: caps and a rate on the client's running documents (``limits.py``), which
  the workers enforce; they do not change the priority.

Tiers live in the counter store, so operators change them without a deploy
(``priority-router tier set``); a client's tier is read inside its publish's own check
(``store/counter.py``, ``store/inflight.py``), in the same round trip.  The stored form is
short text, ``w=2;s=-1`` or ``f=1``, parsed once per distinct value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from .errors import ConfigurationError
from .limits import NONE, Limits
from .thresholds import LEAST_URGENT, MOST_URGENT, Policy, check_priority

#: Largest weight accepted: beyond it a client would never leave priority 1 in practice.
MAX_WEIGHT = 1000.0
#: Largest shift either way: 8 moves any level to any other.
MAX_SHIFT = LEAST_URGENT - MOST_URGENT


@dataclass(frozen=True, slots=True)
class Tier:
    """How one client's count becomes its priority; validated on creation."""

    weight: float = 1.0
    shift: int = 0
    fixed: int | None = None
    limits: Limits = NONE

    def __post_init__(self) -> None:
        weight = self.weight
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
            raise ConfigurationError("tier weight", f"{weight!r} is not a number", "use e.g. 2 or 0.5")
        if not 0 < weight <= MAX_WEIGHT:
            raise ConfigurationError(
                "tier weight",
                f"{weight!r} is not above 0 and at most {MAX_WEIGHT:g}",
                "use a positive number: 2 drops a level half as fast, 0.5 twice as fast",
            )
        object.__setattr__(self, "weight", float(weight))
        shift = self.shift
        if isinstance(shift, bool) or not isinstance(shift, int) or abs(shift) > MAX_SHIFT:
            raise ConfigurationError(
                "tier shift",
                f"{shift!r} is not a whole number of levels from -{MAX_SHIFT} to {MAX_SHIFT}",
                "use e.g. -1 for one level more urgent, 1 for one level less",
            )
        if self.fixed is not None:
            check_priority("tier fixed", self.fixed)
            if self.weight != 1.0 or self.shift != 0:
                raise ConfigurationError(
                    "tier",
                    f"fixed={self.fixed} gives every document priority {self.fixed}, so "
                    f"weight={self.weight:g} and shift={self.shift} would do nothing",
                    "give either fixed, or weight and/or shift",
                )

    def priority(self, pending: float, policy: Policy) -> int:
        """The logical priority for ``pending`` under ``policy`` with this tier."""
        if self.fixed is not None:
            return self.fixed
        # Toward 0: a partial document (or unit of cost) does not count.
        count = int(pending / self.weight) if self.weight != 1.0 else int(pending)
        level = policy.priority_for(count) + self.shift
        return MOST_URGENT if level < MOST_URGENT else LEAST_URGENT if level > LEAST_URGENT else level

    def encode(self) -> str:
        """The stored form: ``w=2;s=-1``, ``f=1``; ``""`` for the neutral tier."""
        if self.fixed is not None:
            return f"f={self.fixed}"
        parts = []
        if self.weight != 1.0:
            parts.append(f"w={self.weight:g}")
        if self.shift:
            parts.append(f"s={self.shift}")
        return ";".join(parts)

    def describe(self) -> str:
        """For people, headers and logs: ``weight=2 shift=-1``, ``fixed=1 max_in_flight=3``,
        ``neutral``."""
        priority = " ".join(_NAMES[part[0]] + part[1:] for part in self.encode().split(";") if part)
        return " ".join(filter(None, (priority, self.limits.describe()))) or "neutral"

    def with_limits(self, limits: Limits) -> Tier:
        """The same tier with ``limits`` instead of its own."""
        return Tier(self.weight, self.shift, self.fixed, limits)

    def applied_as(self, source: str) -> str:
        """How a decision, its ``priority_router_tier`` header and ``inspect`` name this tier
        applied to a client: ``client: weight=2`` (its own) or ``default: fixed=9``."""
        return f"{source}: {self.describe()}"

    def as_dict(self) -> dict[str, object]:
        """The tier as the keywords of ``set_tier`` (``--json`` output)."""
        return {"weight": self.weight, "shift": self.shift, "fixed": self.fixed, **self.limits.as_dict()}


#: The stored form's codes, by the name ``describe`` shows.
_NAMES = {"w": "weight", "s": "shift", "f": "fixed"}


@lru_cache(maxsize=1024)
def decode(stored: bytes | str) -> Tier:
    """A stored tier back (its priority part: limits are stored apart, ``limits.py``);
    ConfigurationError when it is not one (written by hand)."""
    text = stored.decode("ascii", "replace") if isinstance(stored, bytes) else stored
    values: dict[str, str] = {}
    for part in filter(None, text.split(";")):
        name, _, value = part.partition("=")
        if name not in ("w", "s", "f") or not value or name in values:
            raise ConfigurationError(
                "tier", f"stored value {text!r} is not a tier", "set it again with `priority-router tier set`"
            )
        values[name] = value
    try:
        return Tier(
            weight=float(values.get("w", 1.0)),
            shift=int(values.get("s", 0)),
            fixed=int(values["f"]) if "f" in values else None,
        )
    except ValueError as exc:
        if isinstance(exc, ConfigurationError):
            raise
        raise ConfigurationError(
            "tier", f"stored value {text!r} is not a tier", "set it again with `priority-router tier set`"
        ) from None
