"""Tiers in the simulator: the per-client adjustments ``priority-router tier set`` stores.

The router's rule, with the router's own code (``Tier.priority``): a client's own tier,
else the default tier, else the threshold table alone; a neutral tier of its own exempts a
client from the default.  A tier's limits (``limits.py``) go with it: a client's own tier
brings its limits (or none), the default tier's apply to every client without one.  The
simulator holds the tiers fixed for the whole replay (no change mid-trace, so the default
tier's refresh plays no part).

A tier is written as in the CLI's ``tier set`` options and ``tier list``'s output: a comma
or space separated list of ``weight=W``, ``shift=S`` and ``fixed=P``, and of the limits
``max_in_flight=N``, ``max_cost_in_flight=C``, ``borrow`` (a bare word), ``rate=R/s`` (or
``/m``, ``/h``) and ``burst=B``; or ``neutral``.  A tiers file is CSV with the header
``client_id,weight,shift,fixed``, optionally followed by any of the columns
``max_in_flight,borrow,rate,burst,max_cost_in_flight``, and one client per line, an empty
cell meaning "not set" (every cell empty: a neutral tier).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError, PriorityRouterError
from ..limits import NONE, Limits
from ..store.client_ids import normalize_client_id
from ..thresholds import Policy
from ..tiers import Tier
from .costs import level

HEADER = ("client_id", "weight", "shift", "fixed")
#: The optional columns of a tiers file after ``HEADER``, any of them in any order.
LIMIT_COLUMNS = ("max_in_flight", "borrow", "rate", "burst", "max_cost_in_flight")
#: The words of a tier, as ``tier set`` names its options (``borrow`` stands without a value).
NAMES = ("weight", "shift", "fixed", "max_in_flight", "max_cost_in_flight", "rate", "burst")
EXAMPLE = "weight=2,shift=-1 or fixed=9"
LIMITS_EXAMPLE = "max_in_flight=3, borrow, rate=5/s, burst=10, max_cost_in_flight=40"
_TRUE = ("true", "yes", "1", "borrow")
_FALSE = ("false", "no", "0")


class TierSpecError(PriorityRouterError, ValueError):
    """A tier, a ``CLIENT=TIER`` or a tiers file that cannot be read; names the fix."""


@dataclass(frozen=True)
class Tiers:
    """Every client's own tier and the default tier, as the counter store would hold them."""

    clients: Mapping[str, Tier] = field(default_factory=dict)
    default: Tier | None = None

    def __bool__(self) -> bool:
        return bool(self.clients) or self.default is not None

    def tier_of(self, client_id: str) -> Tier | None:
        """The tier the router applies to ``client_id``: its own, else the default."""
        return self.clients.get(client_id, self.default)

    @property
    def prioritizing(self) -> bool:
        """Whether some tier changes priorities (and not only limits)."""
        return any(t.with_limits(NONE) != Tier() for t in self._every())

    @property
    def limiting(self) -> bool:
        """Whether some tier has limits."""
        return any(t.limits for t in self._every())

    def limits_of(self, client_ids: Sequence[str]) -> list[Limits] | None:
        """Each client's limits (``Limits()`` for none), in the order of ``client_ids``;
        None when no client has any."""
        if not self.limiting:
            return None
        found = [NONE if (t := self.tier_of(c)) is None else t.limits for c in client_ids]
        return found if any(found) else None

    def prioritize(self, policy: Policy) -> Callable[[str, float], int] | None:
        """``prioritize(client_id, pending)`` for ``RouterQueue`` (``policies.Prioritize``;
        ``pending`` fractional with costs); None when no tier changes a priority: the table
        alone."""
        if not self.prioritizing:
            return None
        clients, default = dict(self.clients), self.default

        def prioritize(client_id: str, pending: float) -> int:
            return level(clients.get(client_id, default), pending, policy)

        return prioritize

    def missing(self, client_ids: Iterable[str]) -> list[str]:
        """The clients with a tier that are not among ``client_ids`` (sorted)."""
        return sorted(set(self.clients) - set(client_ids))

    def summary(self) -> str:
        """For the report's settings line: ``tiers for 2 clients, default tier fixed=9``."""
        parts = [f"tiers for {len(self.clients)} client(s)"] if self.clients else []
        if self.default is not None:
            parts.append(f"default tier {self.default.describe()}")
        return ", ".join(parts)

    def _every(self) -> list[Tier]:
        return [*self.clients.values(), *([] if self.default is None else [self.default])]


def parse_tier(text: str) -> Tier:
    """``weight=2,shift=-1`` (or ``weight=2 shift=-1``, ``fixed=9``, ``max_in_flight=3,borrow``,
    ``neutral``) -> a validated :class:`Tier`; :class:`TierSpecError` says what is wrong and
    the fix."""
    items = [item for item in re.split(r"[,\s]+", text.strip()) if item]
    if items == ["neutral"]:
        return Tier()
    if not items:
        raise TierSpecError(f"the tier is empty; write e.g. {EXAMPLE}")
    values: dict[str, str] = {}
    for item in items:
        name, equals, value = item.partition("=")
        name = name.strip().lower().replace("-", "_")
        if name == "borrow" and not equals:
            value = "true"
        elif name == "borrow":
            raise TierSpecError(f"{item!r}: borrow takes no value; write borrow, or leave it out")
        elif not equals or name not in NAMES or not value:
            raise TierSpecError(
                f"{item!r} is not weight=W, shift=S or fixed=P"
                + (" (neutral stands alone)" if item == "neutral" else "")
                + f"; write e.g. {EXAMPLE}, or a limit: {LIMITS_EXAMPLE}"
            )
        if name in values:
            raise TierSpecError(f"{name} is given twice in {text!r}; give it once")
        values[name] = value
    return _tier(values, inline=True)


def _tier(written: Mapping[str, str], inline: bool) -> Tier:
    """A validated tier from its settings by name, as written (absent or empty: not set);
    ``inline``: written as in ``tier set`` (``weight=2``), not in a tiers file's cells, as
    the fix's example then is."""
    values = {name: value for name, value in written.items() if value}
    try:
        weight = float(values.get("weight", "1"))
    except ValueError:
        example = "weight=2 or weight=0.5" if inline else "2 or 0.5"
        raise TierSpecError(f"weight {values['weight']!r} is not a number; write e.g. {example}") from None
    shift = _whole("shift", values["shift"], "shift=-1" if inline else "-1") if "shift" in values else 0
    fixed = _whole("fixed", values["fixed"], "fixed=9" if inline else "9") if "fixed" in values else None
    try:
        return Tier(weight, shift, fixed, _limits(values))
    except ConfigurationError as exc:  # the router's own validation: names the setting or limit and the fix
        raise TierSpecError(str(exc)) from None


def _limits(values: Mapping[str, str]) -> Limits:
    """The limits among a tier's ``values`` (names as in :data:`LIMIT_COLUMNS`, text as written)."""
    return Limits(
        max_in_flight=_number(values.get("max_in_flight"), int),
        borrow=_borrow(values.get("borrow", "false")),
        rate=values.get("rate"),
        burst=_number(values.get("burst"), int),
        max_cost_in_flight=_number(values.get("max_cost_in_flight"), float),
    )


def _number(raw: str | None, kind: type[int] | type[float]) -> Any:
    """``raw`` as a number of ``kind``; text that is not one is given to ``Limits`` as it
    is, so that the router's own message refuses it."""
    if raw is None:
        return None
    try:
        return kind(raw)
    except ValueError:
        return raw


def parse_client_tier(text: str) -> tuple[str, Tier]:
    """``acme=weight=2,shift=-1`` -> (``"acme"``, its tier).  The client id ends at the
    first ``=`` (an id holding ``=`` goes in a tiers file)."""
    client, equals, spec = text.partition("=")
    client_id = normalize_client_id(client)
    if not equals or client_id is None:
        raise TierSpecError(
            f"{text!r} is not CLIENT=TIER; write e.g. acme=weight=2,shift=-1 or internal=fixed=1"
        )
    try:
        return client_id, parse_tier(spec)
    except TierSpecError as exc:
        raise TierSpecError(f"{client_id}: {exc}") from None


def load_tiers_csv(path: str | Path) -> dict[str, Tier]:
    """Read a ``client_id,weight,shift,fixed[,max_in_flight,...]`` file; :class:`TierSpecError`
    names a bad line."""
    tiers: dict[str, Tier] = {}
    lines: dict[str, int] = {}
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = _check_header(next(reader, None))
            for row in reader:
                if any(cell.strip() for cell in row):
                    client_id, tier = _client_line(reader.line_num, header, row, lines)
                    tiers[client_id] = tier
                    lines[client_id] = reader.line_num
    except UnicodeDecodeError as exc:
        raise TierSpecError(
            f"the file is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8"
        ) from None
    except csv.Error as exc:
        raise TierSpecError(f"not CSV ({exc}); write plain comma-separated lines") from None
    return tiers


def _client_line(
    line: int, header: tuple[str, ...], row: list[str], lines: Mapping[str, int]
) -> tuple[str, Tier]:
    """One line of a tiers file; ``lines``: the line of each client read so far."""
    if len(row) != len(header):
        raise TierSpecError(
            f"line {line}: {len(row)} field(s) {row!r}; each line is {','.join(header)}, "
            "with empty cells for what is not set (quote a client id that holds a comma)"
        )
    client_id = normalize_client_id(row[0])
    if client_id is None:
        raise TierSpecError(f"line {line}: the client_id is empty; give the client id the router counts")
    if client_id in lines:
        raise TierSpecError(
            f"line {line}: {client_id!r} already has a tier on line {lines[client_id]}; keep one"
        )
    try:
        return client_id, _tier(
            dict(zip(header[1:], (cell.strip() for cell in row[1:]), strict=True)), inline=False
        )
    except TierSpecError as exc:
        raise TierSpecError(f"line {line}: {exc}") from None


def _check_header(row: list[str] | None) -> tuple[str, ...]:
    """The file's columns (``client_id`` first), or :class:`TierSpecError` naming the header's form."""
    expected = ",".join(HEADER)
    if row is None:
        raise TierSpecError(f"the file is empty; its first line must be the header {expected}")
    cells = tuple(cell.strip().lower() for cell in row)
    first, limits = cells[: len(HEADER)], cells[len(HEADER) :]
    if (
        first not in (HEADER, ("client", *HEADER[1:]))
        or not set(limits) <= set(LIMIT_COLUMNS)
        or len(set(limits)) != len(limits)
    ):
        raise TierSpecError(
            f"line 1: the header is {','.join(row)!r}; the first line must be exactly {expected}, "
            f"optionally followed by any of {','.join(LIMIT_COLUMNS)} (each once)"
        )
    return (HEADER[0], *cells[1:])


def _borrow(raw: str) -> bool:
    word = raw.lower()
    if word not in (*_TRUE, *_FALSE):
        raise TierSpecError(f"borrow {raw!r} is not true or false; write true, or leave the cell empty")
    return word in _TRUE


def _whole(name: str, raw: str, example: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise TierSpecError(f"{name} {raw!r} is not a whole number; write e.g. {example}") from None
