"""A threshold table fitted to one trace: what ``priority-router simulate TRACE --tune`` does.

The trace is judged as ``tune.py`` judges a table (its docstring states the objective): the
references (plain Celery's ``fifo``, the default table and ``drr``) run once, then every
table of the geometric family, ``wide`` among them.  The tuned table is the family's
lowest score.  The recommendation is the simplest table within :data:`~tune.TOLERANCE` of
the best score (and meeting every bound when the best does), in the order of
:data:`SIMPLEST_FIRST`: a table is not worth changing to for a score a few hundredths
lower, which is which slot frees first more than the table.

A trace without medium clients and with at most one heavy client has nothing for a
deeper table to separate: the default table's rows (a step every 2 to 6 documents up to
20) already order its clients, and the search is skipped.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from ..thresholds import DEFAULT_THRESHOLDS, WIDE_THRESHOLDS, Policy
from .tune import (
    ANY_BOUND,
    GROUPS,
    LIGHT_BOUND,
    LIGHT_MAX,
    MEDIUM_BOUND,
    MEDIUM_SHARE,
    SLACK,
    TOLERANCE,
    Baseline,
    Case,
    Verdict,
    baseline,
    candidates,
    score,
    search,
)

#: What the search minimises, for people.
OBJECTIVE = (
    "score: the worst of three ratios, each 1.0 at its bound (lower is better): every medium "
    f"client's p95 wait over max({MEDIUM_BOUND} x drr's, drr's + {SLACK:g} s); every client's "
    f"over max({ANY_BOUND} x drr's, drr's + {SLACK:g} s); the light clients' worst over "
    f"max({LIGHT_BOUND} x the default table's, the default table's + one turn: the mean "
    "document length over the slots)"
)
#: The tables a recommendation goes through, simplest first.
SIMPLEST_FIRST = ("default", "wide", "yours", "tuned")
#: How a tuning's rows are named, in the order they are shown.
SHOWN = ("fifo", "default", "wide", "yours", "tuned", "drr")


@dataclass(frozen=True)
class Row:
    """One policy of the comparison: the references have no table and no score."""

    name: str
    table: Policy | None
    #: Each client's p95 wait, by client index.
    p95: list[float]
    verdict: Verdict | None


@dataclass(frozen=True)
class Tuning:
    """What ``--tune`` found on a trace."""

    base: Baseline
    #: By name, in the order of :data:`SHOWN` (``yours`` and ``tuned`` only when run).
    rows: dict[str, Row]
    #: How many tables of the family ran (0 when there was nothing to separate).
    searched: int
    #: The row recommended (:func:`recommend`), and why, in a sentence.
    recommended: str
    why: str
    #: What else the user should know about the trace, a sentence each.
    notes: tuple[str, ...] = ()

    @property
    def table(self) -> Policy:
        """The recommended table."""
        table = self.rows[self.recommended].table
        assert table is not None
        return table


@dataclass(frozen=True)
class GroupWaits:
    """One client group under one policy: its clients, and the worst and median of their p95 waits."""

    clients: int
    worst: float | None
    median: float | None


def tune(
    case: Case,
    current: Policy | None = None,
    jobs: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> Tuning:
    """Fit a table to ``case``; ``current``, the table in use, is shown (and may be kept)
    when it is neither the default nor ``wide``.  ``jobs``, ``progress``: as
    :func:`~tune.search` takes them."""
    base = baseline(case)
    named = {"default": DEFAULT_THRESHOLDS, "wide": WIDE_THRESHOLDS}
    if current is not None and current not in named.values():
        named["yours"] = current
    idle = nothing_to_separate(base)
    family = [] if idle else candidates()
    runs = [named["wide"], *([named["yours"]] if "yours" in named else []), *family]
    ranked = search([base], dict.fromkeys(runs), progress, jobs)
    verdicts = {r.table: r.verdicts[0] for r in ranked}
    rows = {
        "fifo": Row("fifo", None, base.fifo, None),
        "default": Row("default", DEFAULT_THRESHOLDS, base.default, score(base, base.default)),
    }
    for name in ("wide", "yours"):
        if name in named:
            verdict = verdicts[named[name]]
            rows[name] = Row(name, named[name], verdict.p95, verdict)
    if family:
        best = next(r for r in ranked if r.table in set(family))
        rows["tuned"] = Row("tuned", best.table, best.verdicts[0].p95, best.verdicts[0])
    rows["drr"] = Row("drr", None, base.drr, None)
    if idle:
        verb = "use" if "yours" in named else "keep"
        return Tuning(base, rows, 0, "default", f"{idle}: {verb} the default table")
    scores = {name: row.verdict.score for name, row in rows.items() if row.verdict is not None}
    recommended = recommend(scores)
    return Tuning(base, rows, len(family), recommended, _why(rows, recommended), _notes(base))


def recommend(scores: dict[str, float]) -> str:
    """The first of :data:`SIMPLEST_FIRST` among ``scores`` within :data:`~tune.TOLERANCE`
    of the lowest score, and meeting every bound if the best does: simpler is not worth
    missing a bound for."""
    best = min(scores.values())
    return next(
        n
        for n in SIMPLEST_FIRST
        if n in scores and scores[n] <= best * (1 + TOLERANCE) and (scores[n] <= 1.0 or best > 1.0)
    )


def nothing_to_separate(base: Baseline) -> str:
    """Why no table can do better than the default on this trace, or "" when one may."""
    count = Counter(base.groups)
    if len(base.groups) == 1:
        return "the trace has one client: every table serves its documents in the order they came"
    if count["medium"] or count["heavy"] > 1:
        return ""
    heavy = "one heavy client" if count["heavy"] else "no heavy client"
    return (
        f"no medium clients ({_medium_range(base)}) and {heavy}: nothing for a deeper table to "
        "separate, and the default table already puts the light clients ahead"
    )


def _medium_range(base: Baseline) -> str:
    largest = max(Counter(base.case.trace.client).values())
    return (
        f"more than {LIGHT_MAX} documents and at most {MEDIUM_SHARE:.0%} of the largest client's {largest:,}"
    )


def _why(rows: dict[str, Row], recommended: str) -> str:
    scores = {name: row.verdict.score for name, row in rows.items() if row.verdict is not None}
    tuned, chosen = scores["tuned"], scores[recommended]
    found = f"the best table found scores {tuned:.2f}"
    if recommended == "tuned":
        others = ", ".join(f"{_label(n)} {scores[n]:.2f}" for n in SIMPLEST_FIRST[:3] if n in scores)
        why = f"{found}, {others}: use the tuned table"
    elif rows["tuned"].table == rows[recommended].table:
        why = f"the best table found is {_label(recommended)} ({chosen:.2f})"
    else:
        verb = "keep" if recommended in ("default", "yours") else "use"
        why = (
            f"{found}, {_label(recommended)} {chosen:.2f}: not {TOLERANCE:.0%} better, so "
            f"{verb} {_label(recommended)}, the simpler one"
        )
    best = rows["tuned"].verdict
    assert best is not None
    if best.score > 1.0:
        missed = {"any": "every client's"}.get(best.worst, f"the {best.worst} clients'")
        why += f"; no table searched meets every bound on this trace (the best misses {missed} bound)"
    return why


def _label(name: str) -> str:
    return {"default": "the default table", "yours": "your table"}.get(name, name)


def _notes(base: Baseline) -> tuple[str, ...]:
    count = Counter(base.groups)
    if count["medium"]:
        return ()
    return (f"no medium clients: the tables separate the {count['heavy']} heavy clients by size",)


def group_waits(groups: list[str], p95: list[float]) -> dict[str, GroupWaits]:
    """Each group's clients and the worst and median of their p95 waits (None without clients)."""
    found = {}
    for group in GROUPS:
        mine = [w for g, w in zip(groups, p95, strict=True) if g == group]
        found[group] = GroupWaits(
            len(mine), max(mine) if mine else None, statistics.median(mine) if mine else None
        )
    return found
