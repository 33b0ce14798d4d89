"""The threshold table that turns a client's pending count into a priority.

Logical priority 1 is the most urgent and 9 the least, whatever the broker.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TypeGuard

from .errors import ConfigurationError

MOST_URGENT = 1
LEAST_URGENT = 9
#: Tables whose lowest limit is deeper than this are scanned instead of indexed.
MAX_TABLE = 65_536


@dataclass(frozen=True)
class Threshold:
    """``priority`` applies when ``pending < below``."""

    below: int
    priority: int


@dataclass(frozen=True)
class Policy:
    """An ordered threshold table: the first row whose limit the count is under wins.

    Rows go from the lowest limit (the heaviest clients) to the highest; a count
    that is under no limit gets ``fallback``.  The table is validated at
    construction and raises :class:`ConfigurationError` naming the bad setting.
    """

    thresholds: tuple[Threshold, ...]
    fallback: int = MOST_URGENT
    #: ``priority_for(-i)`` for i = 0 .. -lowest limit: one index per publish, not a scan.
    _table: tuple[int, ...] = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        rows = tuple(row if isinstance(row, Threshold) else _row_from_pair(row) for row in self.thresholds)
        object.__setattr__(self, "thresholds", rows)
        if not rows:
            raise ConfigurationError(
                "thresholds", "the table is empty", "give at least one (below, priority) row"
            )
        for row in rows:
            check_priority("thresholds", row.priority)
            if isinstance(row.below, bool) or not isinstance(row.below, int):
                raise ConfigurationError(
                    "thresholds",
                    f"limit {row.below!r} is not an integer",
                    "use whole numbers of pending documents, e.g. (-20, 9)",
                )
            if row.below > 0:
                raise ConfigurationError(
                    "thresholds",
                    f"limit {row.below!r} is above 0, but pending is 0 or negative, so the row "
                    "matches every client",
                    "use limits of 0 or below, e.g. (-20, 9): pending goes down by one per document",
                )
        limits = [row.below for row in rows]
        if any(a >= b for a, b in pairwise(limits)):
            raise ConfigurationError(
                "thresholds",
                f"limits {limits} are not strictly increasing",
                "order rows from the lowest limit (least urgent) up, each limit distinct, "
                "as in DEFAULT_THRESHOLDS",
            )
        check_priority("thresholds fallback", self.fallback)
        priorities = [row.priority for row in rows] + [self.fallback]
        if any(deeper < shallower for deeper, shallower in pairwise(priorities)):
            raise ConfigurationError(
                "thresholds",
                f"priorities {priorities} (lowest limit first, then the fallback) get more urgent "
                "for a busier client somewhere, which would also run a client's later documents "
                "before its earlier ones",
                "give each row a priority the same as or more urgent (lower) than the row below "
                "it, as in DEFAULT_THRESHOLDS",
            )
        deepest = -rows[0].below
        if deepest <= MAX_TABLE:
            object.__setattr__(self, "_table", tuple(self._scan(-i) for i in range(deepest + 1)))

    def priority_for(self, pending: int) -> int:
        """The logical priority for a pending count (0 or negative)."""
        table = self._table
        if -len(table) < pending <= 0:
            return table[-pending]
        if pending < 0 and table:
            return self.thresholds[0].priority  # under the lowest limit
        return self._scan(pending)

    def _scan(self, pending: int) -> int:
        for row in self.thresholds:
            if pending < row.below:
                return row.priority
        return self.fallback

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[int, int]], fallback: int = MOST_URGENT) -> Policy:
        """A table from ``(limit, priority)`` rows, ascending: a count below ``limit`` gets
        ``priority``, the first matching row wins, and ``fallback`` applies past the last.
        Validated: a bad table raises :class:`ConfigurationError` naming the fix."""
        return cls(tuple(_row_from_pair(r) for r in rows), fallback)


def _row_from_pair(row: object) -> Threshold:
    if not isinstance(row, tuple | list) or len(row) != 2:
        raise ConfigurationError(
            "thresholds",
            f"row {row!r} is not a (below, priority) pair",
            "write each row as (limit, priority), e.g. (-20, 9)",
        )
    return Threshold(row[0], row[1])


def is_priority(value: object) -> TypeGuard[int]:
    """Whether ``value`` is a logical priority, a whole number from 1 to 9 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and MOST_URGENT <= value <= LEAST_URGENT


def check_priority(setting: str, priority: object) -> None:
    """Raise :class:`ConfigurationError` naming ``setting`` unless ``priority`` is 1..9."""
    if not is_priority(priority):
        raise ConfigurationError(
            setting,
            f"priority {priority!r} is outside {MOST_URGENT}..{LEAST_URGENT}",
            f"use a whole number from {MOST_URGENT} (most urgent) to {LEAST_URGENT} (least)",
        )


#: The specified table (docs/scheme.md): 9 if pending < -20, 8 if < -14, ... 1 otherwise.
DEFAULT_THRESHOLDS = Policy.from_rows(
    [(-20, 9), (-14, 8), (-12, 7), (-10, 6), (-8, 5), (-6, 4), (-4, 3), (-2, 2)],
    fallback=MOST_URGENT,
)

#: A deeper table, chosen by measurement (``bench/wide_table.py``, docs/scheme.md): a client's
#: first 3 documents at priority 1 as in the scheme's table, then rows to 1,008 documents
#: counted, so clients of 10, 100 and 1,000 documents stay apart.
WIDE_THRESHOLDS = Policy.from_rows(
    [(-1008, 9), (-612, 8), (-482, 7), (-236, 6), (-148, 5), (-75, 4), (-7, 3), (-2, 2)],
    fallback=MOST_URGENT,
)

#: The tables a setting may name instead of giving rows: ``thresholds="wide"``.
NAMED_TABLES = {"default": DEFAULT_THRESHOLDS, "wide": WIDE_THRESHOLDS}


def table_name(policy: Policy) -> str:
    """How a table is shown: its name (``default``, ``wide``), else its rows as
    ``--thresholds`` and ``PRIORITY_ROUTER_THRESHOLDS`` take them."""
    named = (name for name, table in NAMED_TABLES.items() if policy == table)
    return next(named, None) or rows_text(policy)


def rows_text(policy: Policy) -> str:
    """``-20:9,-14:8,...``, with ``fallback:P`` last when the fallback is not 1."""
    text = ",".join(f"{row.below}:{row.priority}" for row in policy.thresholds)
    return text if policy.fallback == MOST_URGENT else f"{text},fallback:{policy.fallback}"


def parse_table(text: str, setting: str = "thresholds") -> Policy:
    """A table from text: a name (``default``, ``wide``) or ``LIMIT:PRIORITY`` rows, lowest
    limit first, with an optional ``fallback:PRIORITY`` last.  Raises
    :class:`ConfigurationError` naming ``setting`` and the fix."""
    name = text.strip().lower()
    if name in NAMED_TABLES:
        return NAMED_TABLES[name]
    rows: list[tuple[int, int]] = []
    fallback = MOST_URGENT
    items = [item.strip() for item in text.split(",")]
    names = " or ".join(NAMED_TABLES)
    for n, item in enumerate(items):
        limit, colon, priority = item.partition(":")
        if not colon:
            raise ConfigurationError(
                setting,
                f"{item!r} is neither a table's name nor a LIMIT:PRIORITY row",
                f"name a table ({names}) or write rows like -20:9,-14:8 (lowest limit first)",
            )
        try:
            value = int(priority)
        except ValueError:
            raise ConfigurationError(
                setting, f"{item!r}: priority {priority!r} is not a whole number", "use 1 to 9"
            ) from None
        if limit.strip().lower() == "fallback":
            if n != len(items) - 1:
                raise ConfigurationError(
                    setting, f"{item!r} is not last", "put fallback:PRIORITY last: it applies under no limit"
                )
            fallback = value
            continue
        try:
            rows.append((int(limit), value))
        except ValueError:
            raise ConfigurationError(
                setting, f"{item!r}: limit {limit!r} is not a whole number", "write limits like -20"
            ) from None
    try:
        return Policy.from_rows(rows, fallback=fallback)
    except ConfigurationError as exc:
        raise ConfigurationError(setting, exc.problem, exc.fix) from None


#: Old names still importable, each with a DeprecationWarning naming the new one.
DEPRECATED = {"DOCBITS_THRESHOLDS": "DEFAULT_THRESHOLDS"}


def deprecated(module: str, name: str) -> object:
    """The value an old name stands for, with a DeprecationWarning; AttributeError if none."""
    new = DEPRECATED.get(name)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(f"{name} is deprecated: use {new}", DeprecationWarning, stacklevel=3)
    return globals()[new]


def __getattr__(name: str) -> object:
    return deprecated(__name__, name)
