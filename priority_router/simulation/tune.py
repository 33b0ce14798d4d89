"""Judging threshold tables on traces, and searching for the best one (``simulate --tune``,
``bench/wide_table.py``, which chose ``thresholds="wide"``).

A trace's clients fall in three groups by their documents in the trace: *light* (at most
:data:`LIGHT_MAX`), *medium* (more, and at most a tenth of the largest client's) and
*heavy* (the rest).  A table is judged against two references run on the same trace:
deficit round robin over clients (``drr``, the ideal no broker offers) and the scheme's
own table (``DEFAULT_THRESHOLDS``), under the same counting mode and costs.  Its score is
the worst of three ratios, each 1.0 at its bound:

- every medium client's p95 wait over ``max(1.1 x drr's, drr's + 2 s)``;
- every client's p95 wait over ``max(1.5 x drr's, drr's + 2 s)``;
- the light clients' worst p95 wait over ``max(1.1 x the default table's, the default
  table's + one turn)``, where a turn is the trace's mean document length over the slots:
  about how long a light document waits for the next slot to free, whatever the table, so
  differences within it are which slot frees first, not the table.

A table meets the criteria on a trace when its score is at most 1.0.  Over several traces
(and modes, and costs) :func:`search` ranks tables by their worst score; a recommendation
(``fit.py``) prefers a simpler table within :data:`TOLERANCE` of the best.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

from ..config import RouterConfig
from ..thresholds import DEFAULT_THRESHOLDS, LEAST_URGENT, MOST_URGENT, Policy
from .engine import run
from .gate import GATE_TICK
from .policies import build
from .tiers import Tiers
from .trace import Trace

#: The most documents of a light client.
LIGHT_MAX = 20
#: A medium client has at most this share of the largest client's documents.
MEDIUM_SHARE = 0.1
#: The bounds: a medium client's p95 within 1.1x drr's, any client's within 1.5x, the light
#: clients' worst within 1.1x the default table's; waits within SLACK s of drr's always pass.
MEDIUM_BOUND, ANY_BOUND, LIGHT_BOUND = 1.1, 1.5, 1.1
SLACK = 2.0
#: How far above the best score a simpler table is still recommended (``fit.py``).
TOLERANCE = 0.05
GROUPS = ("light", "medium", "heavy")
#: The geometric family searched: the first limit, and the ratio between limits.
STARTS = (2, 3, 4, 5, 6, 8)
RATIOS = tuple(round(1.5 + 0.1 * i, 1) for i in range(26))  # 1.5 .. 4.0


def client_groups(trace: Trace) -> list[str]:
    """Each client's group (by client index): light, medium or heavy."""
    counts = [0] * len(trace.clients)
    for c in trace.client:
        counts[c] += 1
    largest = max(counts)
    return [
        "light" if n <= LIGHT_MAX else "medium" if n <= MEDIUM_SHARE * largest else "heavy" for n in counts
    ]


def client_p95(case: Case, policy: str, table: Policy = DEFAULT_THRESHOLDS) -> list[float]:
    """Each client's p95 wait (by client index) when the case's trace runs under ``policy``
    with ``table``."""
    trace = case.trace
    limits = None if case.tiers is None else case.tiers.limits_of(trace.clients)
    discipline = build(policy, case.config(table), case.quantum, case.tiers)
    schedule = run(trace, discipline, case.workers, case.overhead, limits, case.gate_tick)
    waits: list[list[float]] = [[] for _ in trace.clients]
    for c, s, p in zip(trace.client, schedule.started, schedule.published, strict=True):
        waits[c].append(s - p)
    return [sorted_p95(sorted(w)) for w in waits]


def sorted_p95(ordered: Sequence[float]) -> float:
    """``metrics.p95`` of values already sorted, to the last bit: the inclusive 95th
    percentile as ``statistics.quantiles`` interpolates it, without sorting again or
    computing the other 18 cut points (``quantiles`` took a tenth of a search's time on
    100,000 documents under cProfile)."""
    if len(ordered) == 1:
        return ordered[0]
    j, delta = divmod(19 * (len(ordered) - 1), 20)
    return (ordered[j] * (20 - delta) + ordered[j + 1] * delta) / 20


def geometric(start: int, ratio: float) -> Policy:
    """The table whose 8 limits are -start, -start*ratio, -start*ratio^2, ... (rounded, each
    deeper than the one before), priorities 2..9 from the top, 1 above the first limit."""
    limits: list[int] = []
    for k in range(LEAST_URGENT - MOST_URGENT):
        limit = round(start * ratio**k)
        limits.append(max(limit, limits[-1] + 1) if limits else limit)
    return table_of(limits)


def table_of(limits: Sequence[int]) -> Policy:
    """The table whose 8 limits, shallowest first, are minus ``limits``: priorities 2..9 from
    the top, 1 above the first limit."""
    return Policy.from_rows(
        [
            (-limit, priority)
            for limit, priority in zip(reversed(limits), range(LEAST_URGENT, 1, -1), strict=True)
        ]
    )


def candidates() -> list[Policy]:
    """The tables searched: the geometric family (:data:`STARTS` x :data:`RATIOS`)."""
    return list(dict.fromkeys(geometric(s, r) for s in STARTS for r in RATIOS))


@dataclass(frozen=True)
class Case:
    """One trace to judge tables on, and how it is replayed: its slots, counting mode, reset
    interval, max_wait (the router's policy then runs with its sweep), drr's quantum (None:
    the largest cost), each document's overhead, and the clients' tiers and gate tick."""

    name: str
    trace: Trace
    workers: int
    mode: str = "seed"
    reset_interval: float = 1500.0
    max_wait: float | None = None
    quantum: float | None = None
    overhead: float = 0.0
    tiers: Tiers | None = None
    gate_tick: float = GATE_TICK

    @property
    def policy(self) -> str:
        """The router's policy the tables are judged under: ``seed``, ``inflight+max_wait``, ..."""
        return self.mode if self.max_wait is None else f"{self.mode}+max_wait"

    def config(self, table: Policy = DEFAULT_THRESHOLDS) -> RouterConfig:
        return RouterConfig(reset_interval=self.reset_interval, max_wait=self.max_wait, thresholds=table)


@dataclass(frozen=True)
class Baseline:
    """A case's references: the groups, and each client's p95 under fifo, the default table and drr."""

    case: Case
    groups: list[str]
    fifo: list[float]
    default: list[float]
    drr: list[float]
    #: The trace's mean document length over its slots: the light clients' slack.
    turn: float


@dataclass(frozen=True)
class Verdict:
    """A table on one case: each client's p95 wait, and the score (1.0 at the bound)."""

    p95: list[float]
    score: float
    #: Which bound the score is from: "medium", "any" or "light".
    worst: str


def baseline(case: Case) -> Baseline:
    """Run the references once per case."""
    return Baseline(
        case,
        client_groups(case.trace),
        client_p95(case, "fifo"),
        client_p95(case, case.policy),
        client_p95(case, "drr"),
        sum(case.trace.duration) / len(case.trace) / case.workers,
    )


def judge(base: Baseline, table: Policy) -> Verdict:
    """Run ``table`` on the case and score it against the references."""
    return score(base, client_p95(base.case, base.case.policy, table))


def score(base: Baseline, waits: Sequence[float]) -> Verdict:
    """Score p95 waits (by client index) against a case's references."""
    scores = {"medium": 0.0, "any": 0.0, "light": 0.0}
    for group, mine, ideal in zip(base.groups, waits, base.drr, strict=True):
        scores["any"] = max(scores["any"], _ratio(mine, max(ANY_BOUND * ideal, ideal + SLACK)))
        if group == "medium":
            scores["medium"] = max(scores["medium"], _ratio(mine, max(MEDIUM_BOUND * ideal, ideal + SLACK)))
    light = [w for g, w in zip(base.groups, waits, strict=True) if g == "light"]
    if light:
        before = max(w for g, w in zip(base.groups, base.default, strict=True) if g == "light")
        scores["light"] = _ratio(max(light), max(LIGHT_BOUND * before, before + base.turn))
    worst = max(scores, key=lambda k: scores[k])
    return Verdict(list(waits), scores[worst], worst)


def _ratio(value: float, bound: float) -> float:
    return value / bound if bound > 0 else (0.0 if value <= 0 else float("inf"))


@dataclass(frozen=True)
class Ranked:
    """A table and its verdicts on every case; its score is the worst of them."""

    table: Policy
    verdicts: list[Verdict]

    @property
    def score(self) -> float:
        return max(v.score for v in self.verdicts)

    @property
    def passed(self) -> int:
        return sum(v.score <= 1.0 for v in self.verdicts)


def search(
    bases: Sequence[Baseline],
    tables: Iterable[Policy] | None = None,
    progress: Callable[[int, int], None] | None = None,
    jobs: int = 1,
) -> list[Ranked]:
    """Every table (by default :func:`candidates`) judged on every case, best first: the
    lowest worst score, then the lowest mean score, then the shallower table.  With
    ``jobs`` > 1 the tables run in that many processes; the runs are deterministic, so the
    ranking is the same.  ``progress(done, total)`` is called before the first table and
    after each."""
    chosen = list(candidates() if tables is None else tables)
    report = progress or (lambda done, total: None)
    report(0, len(chosen))
    if jobs > 1 and len(chosen) > 1:
        verdicts = _judge_in_processes(bases, chosen, report, jobs)
    else:
        verdicts = []
        for table in chosen:
            verdicts.append(judge_all(bases, table))
            report(len(verdicts), len(chosen))
    ranked = [Ranked(table, found) for table, found in zip(chosen, verdicts, strict=True)]
    return sorted(
        ranked,
        key=lambda r: (
            round(r.score, 6),
            round(sum(v.score for v in r.verdicts) / len(r.verdicts), 6),
            -r.table.thresholds[0].below,
        ),
    )


def judge_all(bases: Sequence[Baseline], table: Policy) -> list[Verdict]:
    """``table`` judged on every case."""
    return [judge(base, table) for base in bases]


#: The cases a search process judges tables on, set once when it starts.
_BASES: Sequence[Baseline] = ()


def _adopt(bases: Sequence[Baseline]) -> None:
    global _BASES
    _BASES = bases


def _judge_here(table: Policy) -> list[Verdict]:
    return judge_all(_BASES, table)


def _judge_in_processes(
    bases: Sequence[Baseline], tables: list[Policy], report: Callable[[int, int], None], jobs: int
) -> list[list[Verdict]]:
    # spawn, not fork: the caller may run threads (the CLI's spinner), which a fork copies
    # mid-stride; each process receives the cases once, then only tables.
    pool = ProcessPoolExecutor(jobs, get_context("spawn"), _adopt, (bases,))
    try:
        verdicts = []
        for found in pool.map(_judge_here, tables):
            verdicts.append(found)
            report(len(verdicts), len(tables))
    finally:
        pool.shutdown(cancel_futures=True)  # on Ctrl-C, not after every table still queued
    return verdicts


def processors() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
