"""Tiers in the simulator: the per-client adjustments ``priority-router tier set`` stores.

The router's rule, with the router's own code (``Tier.priority``): a client's own tier,
else the default tier, else the threshold table alone; a neutral tier of its own exempts a
client from the default.  The simulator holds the tiers fixed for the whole replay (no
change mid-trace, so the default tier's refresh plays no part).

A tier is written as in the CLI's ``tier set`` options and ``tier list``'s output: a comma
or space separated list of ``weight=W``, ``shift=S`` and ``fixed=P``, or ``neutral``.  A
tiers file is CSV with the header ``client_id,weight,shift,fixed`` and one client per line,
an empty cell meaning "not set" (all three empty: a neutral tier).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigurationError, PriorityRouterError
from ..policy import Policy
from ..store.keys import normalize_client_id
from ..tiers import Tier
from .costs import level

HEADER = ("client_id", "weight", "shift", "fixed")
#: The words of a tier, as ``tier set`` names its options.
NAMES = ("weight", "shift", "fixed")
EXAMPLE = "weight=2,shift=-1 or fixed=9"


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

    def prioritize(self, policy: Policy) -> Callable[[str, float], int] | None:
        """``prioritize(client_id, pending)`` for ``RouterQueue`` (``policies.Prioritize``;
        ``pending`` fractional with costs); None without tiers: the table alone."""
        if not self:
            return None
        clients, default = dict(self.clients), self.default

        def prioritize(client_id: str, pending: float) -> int:
            return level(clients.get(client_id, default), pending, policy)

        return prioritize

    def missing(self, client_ids: Iterable[str]) -> list[str]:
        """The clients with a tier that are not among ``client_ids`` (sorted)."""
        present = set(client_ids)
        return sorted(c for c in self.clients if c not in present)

    def summary(self) -> str:
        """For the report's settings line: ``tiers for 2 clients, default tier fixed=9``."""
        parts = [f"tiers for {len(self.clients)} client(s)"] if self.clients else []
        if self.default is not None:
            parts.append(f"default tier {self.default.describe()}")
        return ", ".join(parts)


def parse_tier(text: str) -> Tier:
    """``weight=2,shift=-1`` (or ``weight=2 shift=-1``, ``fixed=9``, ``neutral``) -> a
    validated :class:`Tier`; :class:`TierSpecError` says what is wrong and the fix."""
    items = [item for item in re.split(r"[,\s]+", text.strip()) if item]
    if items == ["neutral"]:
        return Tier()
    if not items:
        raise TierSpecError(f"the tier is empty; write e.g. {EXAMPLE}")
    values: dict[str, str] = {}
    for item in items:
        name, equals, value = item.partition("=")
        name = name.strip().lower()
        if not equals or name not in NAMES or not value:
            raise TierSpecError(
                f"{item!r} is not weight=W, shift=S or fixed=P"
                + (" (neutral stands alone)" if item == "neutral" else "")
                + f"; write e.g. {EXAMPLE}"
            )
        if name in values:
            raise TierSpecError(f"{name} is given twice in {text!r}; give it once")
        values[name] = value
    try:
        weight = float(values.get("weight", "1"))
    except ValueError:
        raise TierSpecError(
            f"weight {values['weight']!r} is not a number; write e.g. weight=2 or weight=0.5"
        ) from None
    shift = _whole("shift", values.get("shift", "0"), "shift=-1")
    fixed = _whole("fixed", values["fixed"], "fixed=9") if "fixed" in values else None
    return _validated(weight, shift, fixed)


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
    """Read a ``client_id,weight,shift,fixed`` file; :class:`TierSpecError` names a bad line."""
    tiers: dict[str, Tier] = {}
    lines: dict[str, int] = {}
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            _check_header(next(reader, None))
            for row in reader:
                if any(cell.strip() for cell in row):
                    client_id, tier = _client_line(reader.line_num, row, lines)
                    tiers[client_id] = tier
                    lines[client_id] = reader.line_num
    except UnicodeDecodeError as exc:
        raise TierSpecError(
            f"the file is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8"
        ) from None
    except csv.Error as exc:
        raise TierSpecError(f"not CSV ({exc}); write plain comma-separated lines") from None
    return tiers


def _client_line(line: int, row: list[str], lines: Mapping[str, int]) -> tuple[str, Tier]:
    """One line of a tiers file; ``lines``: the line of each client read so far."""
    if len(row) != len(HEADER):
        raise TierSpecError(
            f"line {line}: {len(row)} field(s) {row!r}; each line is client_id,weight,shift,fixed, "
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
        return client_id, _row_tier(row[1:])
    except TierSpecError as exc:
        raise TierSpecError(f"line {line}: {exc}") from None


def _check_header(row: list[str] | None) -> None:
    expected = ",".join(HEADER)
    if row is None:
        raise TierSpecError(f"the file is empty; its first line must be the header {expected}")
    cells = tuple(cell.strip().lower() for cell in row)
    if cells not in (HEADER, ("client", *HEADER[1:])):
        raise TierSpecError(
            f"line 1: the header is {','.join(row)!r}; the first line must be exactly {expected}"
        )


def _row_tier(cells: list[str]) -> Tier:
    raw_weight, raw_shift, raw_fixed = (cell.strip() for cell in cells)
    try:
        weight = float(raw_weight) if raw_weight else 1.0
    except ValueError:
        raise TierSpecError(f"weight {raw_weight!r} is not a number; write e.g. 2 or 0.5") from None
    shift = _whole("shift", raw_shift, "-1") if raw_shift else 0
    fixed = _whole("fixed", raw_fixed, "9") if raw_fixed else None
    return _validated(weight, shift, fixed)


def _whole(name: str, raw: str, example: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise TierSpecError(f"{name} {raw!r} is not a whole number; write e.g. {example}") from None


def _validated(weight: float, shift: int, fixed: int | None) -> Tier:
    try:
        return Tier(weight, shift, fixed)
    except ConfigurationError as exc:  # the router's own validation: names the setting and the fix
        raise TierSpecError(str(exc)) from None
