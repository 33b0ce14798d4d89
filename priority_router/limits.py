"""Per-client limits: how many of a client's documents may run at once, and how fast
they may start.  A client's limits are part of its tier (``tiers.py``) and are set with
it (``set_tier(..., max_in_flight=3)``, ``priority-router tier set acme --max-in-flight 3``);
the worker's gate enforces them (``integration/gate.py``, docs/caps.md).

- ``max_in_flight``: at most N documents of the client run at once, across every worker;
- ``max_cost_in_flight``: at most C units of cost run at once (a document's cost is its
  ``priority_router_cost`` header, 1 without one);
- ``borrow``: a capped client may use more than its cap while no other client's
  document waits;
- ``rate``: at most R documents start per second, minute or hour (Celery's ``"R/s"``,
  ``"R/m"``, ``"R/h"``), as a token bucket holding up to ``burst`` tokens (R by default).

The stored form is short text, ``m=3;b=1;r=5/s;rb=10;mc=40``, kept apart from the tier's
own text so that releases that know nothing of limits still read every tier.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from .errors import ConfigurationError

#: Largest cap accepted, in documents or in units of cost.
MAX_LIMIT = 1_000_000
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
RATE_EXAMPLE = '"5/s", "100/m" or "1000/h"'


@dataclass(frozen=True, slots=True)
class Limits:
    """One client's caps and rate; validated on creation.  ``Limits()`` limits nothing."""

    max_in_flight: int | None = None
    borrow: bool = False
    rate: str | None = None
    burst: int | None = None
    max_cost_in_flight: float | None = None

    def __post_init__(self) -> None:
        cap = self.max_in_flight
        if cap is not None and (
            isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_LIMIT
        ):
            raise ConfigurationError(
                "max_in_flight",
                f"{cap!r} is not a whole number of documents from 1 to {MAX_LIMIT:,}",
                "use e.g. 3; to lift a cap, set the tier again without it (or `tier unset`)",
            )
        cost = self.max_cost_in_flight
        if cost is not None:
            if isinstance(cost, bool) or not isinstance(cost, int | float) or not math.isfinite(cost):
                raise ConfigurationError("max_cost_in_flight", f"{cost!r} is not a number", "use e.g. 40")
            if not 0 < cost <= MAX_LIMIT:
                raise ConfigurationError(
                    "max_cost_in_flight",
                    f"{cost!r} is not above 0 and at most {MAX_LIMIT:,}",
                    "use the units the documents' costs are in, e.g. 40 (pages)",
                )
            object.__setattr__(self, "max_cost_in_flight", float(cost))
        if not isinstance(self.borrow, bool):
            raise ConfigurationError("borrow", f"{self.borrow!r} is not True or False", "use borrow=True")
        if self.borrow and cap is None and cost is None:
            raise ConfigurationError(
                "borrow",
                "borrow=True lets a capped client run beyond its cap while nobody else waits, "
                "but no cap is given",
                "give max_in_flight (or max_cost_in_flight) with it",
            )
        if self.rate is not None:
            per_second(self.rate)
        burst = self.burst
        if burst is not None:
            if self.rate is None:
                raise ConfigurationError(
                    "burst",
                    "a burst is the size of a rate's bucket, but no rate is given",
                    "give rate= with it",
                )
            if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= MAX_LIMIT:
                raise ConfigurationError(
                    "burst",
                    f"{burst!r} is not a whole number of documents from 1 to {MAX_LIMIT:,}",
                    "use e.g. 10",
                )

    def __bool__(self) -> bool:
        return self != NONE

    @property
    def per_second(self) -> float | None:
        """The rate in documents per second, None without a rate."""
        return None if self.rate is None else per_second(self.rate)

    @property
    def bucket(self) -> int | None:
        """How many tokens the rate's bucket holds: ``burst``, else R (at least 1)."""
        if self.rate is None:
            return None
        if self.burst is not None:
            return self.burst
        return max(1, math.ceil(float(self.rate.partition("/")[0])))

    def encode(self) -> str:
        """The stored form: ``m=3;b=1;r=5/s``; ``""`` when nothing is limited."""
        return ";".join(f"{code}={value}" for code, _, value in self._given())

    def describe(self) -> str:
        """For people and logs: ``max_in_flight=3 borrow rate=5/s``; ``""`` when none."""
        return " ".join(name if code == "b" else f"{name}={value}" for code, name, value in self._given())

    def as_dict(self) -> dict[str, object]:
        """The limits as the keywords of ``set_tier`` (``--json`` output)."""
        return {name: getattr(self, name) for name in _NAMES}

    def _given(self) -> list[tuple[str, str, str]]:
        """Each limit set, in the stored form's order: its code there, its name, its value."""
        cost = None if self.max_cost_in_flight is None else f"{self.max_cost_in_flight:g}"
        values = (self.max_in_flight, cost, 1 if self.borrow else None, self.rate, self.burst)
        return [(c, n, str(v)) for c, n, v in zip(_CODES, _NAMES, values, strict=True) if v is not None]


#: The limits' names, and their codes in the stored form, in the order both are written.
_NAMES = ("max_in_flight", "max_cost_in_flight", "borrow", "rate", "burst")
_CODES = ("m", "mc", "b", "r", "rb")

NONE = Limits()


def per_second(rate: object) -> float:
    """Documents per second for Celery's rate syntax (``"5/s"``, ``"100/m"``, ``"1000/h"``);
    ConfigurationError naming the form for anything else."""
    if not isinstance(rate, str):
        raise ConfigurationError("rate", f"{rate!r} is not a rate", f"use {RATE_EXAMPLE}")
    count, slash, unit = rate.strip().partition("/")
    try:
        value = float(count)
    except ValueError:
        value = math.nan
    if not slash or unit not in _UNITS or not math.isfinite(value) or value <= 0 or value > MAX_LIMIT:
        raise ConfigurationError(
            "rate",
            f"{rate!r} is not R/s, R/m or R/h with R above 0 and at most {MAX_LIMIT:,}",
            f"use {RATE_EXAMPLE}",
        )
    return value / _UNITS[unit]


@lru_cache(maxsize=1024)
def decode(stored: bytes | str) -> Limits:
    """Stored limits back; ConfigurationError when they are not (written by hand)."""
    text = stored.decode("ascii", "replace") if isinstance(stored, bytes) else stored
    values: dict[str, str] = {}
    for part in filter(None, text.split(";")):
        name, _, value = part.partition("=")
        if name not in _CODES or not value or name in values:
            raise _unreadable(text)
        values[name] = value
    try:
        return Limits(
            max_in_flight=int(values["m"]) if "m" in values else None,
            borrow=values.get("b") == "1",
            rate=values.get("r"),
            burst=int(values["rb"]) if "rb" in values else None,
            max_cost_in_flight=float(values["mc"]) if "mc" in values else None,
        )
    except ConfigurationError:
        raise
    except ValueError:
        raise _unreadable(text) from None


def _unreadable(text: str) -> ConfigurationError:
    return ConfigurationError(
        "limits",
        f"stored value {text!r} is not a client's limits",
        "set the tier again with `priority-router tier set`",
    )
