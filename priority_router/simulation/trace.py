"""The documents a simulation replays: a CSV trace, or a built-in workload's documents.

A trace file is CSV with the header ``timestamp,client_id,duration``, then one document
per line: when it was published (seconds; relative or Unix time, any order: documents
are published in timestamp order, ties in file order), whose it is (the router's client
id, surrounding spaces dropped as the router drops them) and how many seconds it holds a
worker slot (more than 0).  An optional fourth column, ``cost``, is what the document
counts for (``costs.py``; an empty cell or no column: 1).  Blank lines are skipped.  A
line that cannot be read raises :class:`TraceError` naming the line, what is wrong with it
and the fix.
"""

from __future__ import annotations

import csv
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path

from ..errors import PriorityRouterError
from ..store.client_ids import normalize_client_id
from .costs import MAX_COST, MAX_UNITS, ONE, RESOLUTION, InvalidCost, cost_units

HEADER = ("timestamp", "client_id", "duration")
#: The header of a trace whose documents have costs.
COST_HEADER = (*HEADER, "cost")


class TraceError(PriorityRouterError, ValueError):
    """A trace that cannot be simulated; the message names the line and the fix."""


@dataclass(frozen=True)
class Trace:
    """Documents in publishing order, held column by column (a million of them stay small).

    Document ``i`` belongs to client ``clients[client[i]]`` and holds a worker slot for
    ``duration[i]`` seconds.  It is published ``at[i]`` seconds after the start or, when
    ``after[i] >= 0``, ``at[i]`` seconds after document ``after[i]`` finishes: a client
    that sends its next document once the previous one is done (a closed loop).  It
    costs ``cost_units[i]`` thousandths (``costs.RESOLUTION`` per cost 1); no
    ``cost_units`` means every document costs 1.
    """

    #: Client index -> client id.
    clients: tuple[str, ...]
    #: Client index -> the group it is reported in ("light", "heavy", "10-99 docs", ...).
    groups: tuple[str, ...]
    client: list[int]
    at: list[float]
    duration: list[float]
    #: Per document: the earlier document whose finish publishes it, or -1 (published at ``at``).
    after: list[int] = field(default_factory=list)
    #: Per document: its cost in units; empty when every document costs 1.
    cost_units: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.client)
        if not n:
            raise TraceError("the trace has no documents")
        if len(self.at) != n or len(self.duration) != n or (self.after and len(self.after) != n):
            raise TraceError("client, at, duration and after must have one entry per document")
        if len(self.groups) != len(self.clients):
            raise TraceError("groups must have one entry per client")
        if not all(0 <= c < len(self.clients) for c in self.client):
            raise TraceError("a document names a client index that is not in clients")
        if not all(d > 0 and math.isfinite(d) for d in self.duration):
            raise TraceError("every duration must be a positive number of seconds")
        if self.cost_units and len(self.cost_units) != n:
            raise TraceError("cost_units must be empty or have one entry per document")
        if not all(0 < u <= MAX_UNITS for u in self.cost_units):
            raise TraceError(f"every cost must be above 0 and at most {MAX_COST:,}")
        if self.after and not all(-1 <= a < i for i, a in enumerate(self.after)):
            raise TraceError("a document can follow only an earlier document (after[i] < i)")
        opened = [t for i, t in enumerate(self.at) if not self.after or self.after[i] < 0]
        if not opened:
            raise TraceError("no document is published at a time of its own: nothing would start")
        if any(b < a for a, b in pairwise(opened)):
            raise TraceError("documents published at a time of their own must be in time order")

    def __len__(self) -> int:
        return len(self.client)


class TraceBuilder:
    """Collects documents one by one and interns client ids."""

    def __init__(self) -> None:
        self._index: dict[str, int] = {}
        self._groups: list[str] = []
        self.client: list[int] = []
        self.at: list[float] = []
        self.duration: list[float] = []
        self.after: list[int] = []
        #: Empty until a document costs other than 1.
        self.cost_units: list[int] = []

    def add(
        self, client_id: str, group: str, at: float, duration: float, after: int = -1, units: int = ONE
    ) -> int:
        """Append one document of ``units`` cost units (``costs.cost_units``); returns its index."""
        index = self._index.get(client_id)
        if index is None:
            index = self._index[client_id] = len(self._index)
            self._groups.append(group)
        self.client.append(index)
        self.at.append(at)
        self.duration.append(duration)
        self.after.append(after)
        if units != ONE or self.cost_units:
            if not self.cost_units:
                self.cost_units = [ONE] * (len(self.client) - 1)
            self.cost_units.append(units)
        return len(self.client) - 1

    def build(self, groups: Sequence[str] | None = None) -> Trace:
        """The trace; ``groups`` (one per client) replaces the groups given to :meth:`add`."""
        after = self.after if any(a >= 0 for a in self.after) else []
        return Trace(
            clients=tuple(self._index),
            groups=tuple(self._groups if groups is None else groups),
            client=self.client,
            at=self.at,
            duration=self.duration,
            after=after,
            cost_units=self.cost_units,
        )


def size_group(documents: int) -> str:
    """A client's group in a CSV trace: its number of documents by powers of ten."""
    if documents == 1:
        return "1 doc"
    low = 10 ** (len(str(documents)) - 1)
    return f"{max(2, low)}-{10 * low - 1} docs"


def load_csv(path: str | Path) -> Trace:
    """Read a ``timestamp,client_id,duration[,cost]`` trace; :class:`TraceError` names a bad line."""
    rows: list[tuple[float, str, float, int]] = []
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = _check_header(next(reader, None))
            for row in reader:
                if len(row) != len(header):
                    if not row or not any(cell.strip() for cell in row):
                        continue
                    raise TraceError(
                        f"line {reader.line_num}: {len(row)} field(s) {row!r}; each line is "
                        f"{','.join(header)} (quote a client id that holds a comma)"
                    )
                rows.append(_document(reader.line_num, row))
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"the file is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8"
        ) from None
    except csv.Error as exc:
        raise TraceError(
            f"line {reader.line_num}: not CSV ({exc}); write plain comma-separated lines"
        ) from None
    if not rows:
        raise TraceError("the trace has a header but no documents; add lines timestamp,client_id,duration")
    rows.sort(key=lambda r: r[0])  # stable: documents published at one instant keep file order
    first = rows[0][0]
    builder = TraceBuilder()
    for timestamp, client_id, duration, units in rows:
        builder.add(client_id, "", timestamp - first, duration, -1, units)
    counts = Counter(builder.client)
    return builder.build([size_group(counts[c]) for c in range(len(counts))])


def _check_header(row: list[str] | None) -> tuple[str, ...]:
    if row is None:
        raise TraceError(f"the file is empty; its first line must be the header {','.join(HEADER)}")
    cells = tuple(cell.strip().lower() for cell in row)
    if cells not in (HEADER, COST_HEADER):
        raise TraceError(
            f"line 1: the header is {','.join(row)!r}; the first line must be exactly {','.join(HEADER)} "
            f"(in that order), or {','.join(COST_HEADER)} when documents have costs"
        )
    return cells


def _document(line: int, row: list[str]) -> tuple[float, str, float, int]:
    raw_at, raw_client, raw_duration, *cost = row
    at = _number(raw_at)
    if not math.isfinite(at):
        raise TraceError(f"line {line}: timestamp {raw_at!r} is not a number of seconds; write e.g. 12.5")
    client_id = normalize_client_id(raw_client)
    if client_id is None:
        raise TraceError(
            f"line {line}: the client_id is empty; give every document the client id the router counts"
        )
    duration = _number(raw_duration)
    if not (math.isfinite(duration) and duration > 0):
        raise TraceError(
            f"line {line}: duration {raw_duration!r} is not a positive number of seconds; "
            "write how long the document holds a worker, e.g. 0.05"
        )
    return at, client_id, duration, _cost(line, cost[0]) if cost else ONE


def _number(raw: str) -> float:
    """``raw`` as a float; NaN when it is not a number."""
    try:
        return float(raw)
    except ValueError:
        return math.nan


def _cost(line: int, raw: str) -> int:
    text = raw.strip()
    if not text:
        return ONE  # a document published without a cost counts 1, as in the router
    try:
        return cost_units(text)
    except InvalidCost as exc:  # the router's own rule and message
        raise TraceError(
            f"line {line}: {exc}; fix the cost column, or leave the cell empty for a cost of 1"
        ) from None


#: ``--cost`` choices, the default first.
BASES = ("column", "duration", "document")


def counted_by(trace: Trace, basis: str) -> Trace:
    """``trace`` with each document's cost as ``basis`` says (a ``--cost`` choice): the
    trace's ``cost`` column (``column``, 1 without one), its duration (``duration``: expected
    seconds), or 1 (``document``)."""
    if basis == "column":
        return trace
    if basis == "document":
        return replace(trace, cost_units=[]) if trace.cost_units else trace
    if basis == "duration":
        # A document shorter than the smallest cost counted costs that much, not nothing.
        units = [max(1, round(d * RESOLUTION)) for d in trace.duration]
        return replace(trace, cost_units=[] if all(u == ONE for u in units) else units)
    raise ValueError(f"cost {basis!r} is not one of {', '.join(BASES)}")
