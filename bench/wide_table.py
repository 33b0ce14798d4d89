"""How ``thresholds="wide"`` was chosen: a search over threshold tables, judged per client group.

Replays the built-in workloads, three traces with several heavy clients (the ``giant-and-medium``,
``several-giants`` and ``staggered-giants`` workloads: giants seconds apart, medium clients of
20-500 documents, many light ones, documents of 1-3 s) and docs/simulate.md's hour of traffic,
counted by document and by seconds (``--cost duration``), in both counting modes.  Each table
of the geometric family (``simulation/tune.py``: 8 limits, each the one before times a ratio)
is scored against deficit round robin (``drr``) and the scheme's table on the same run; the
search ranks them by their worst score over the cases (1.0 meets every bound) and chooses, of
those within 5% of the best, the one meeting every bound on the most cases (``tune.choose``).
Then it prints, per case, each client group's p95 waits under plain Celery (``fifo``), the
scheme's table, the winner and ``drr``.

    python bench/wide_table.py            # about 40 s on one core
    python bench/wide_table.py --top 20   # more of the ranking
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from priority_router.simulation.costs import counted_by  # noqa: E402
from priority_router.simulation.trace import Trace, TraceBuilder  # noqa: E402
from priority_router.simulation.tune import (  # noqa: E402
    Baseline,
    Case,
    baseline,
    candidates,
    choose,
    judge,
    score,
    search,
)
from priority_router.simulation.workloads import DEFAULT_SEED, WORKLOADS  # noqa: E402
from priority_router.thresholds import DEFAULT_THRESHOLDS, WIDE_THRESHOLDS, Policy, rows_text  # noqa: E402

#: (workload, slots): the benchmarks' workloads on their 4 threads, the giants on 8, 16, 32.
WORKLOAD_SLOTS = {
    "noisy-neighbour": 4,
    "steady-burst": 4,
    "heavy-mix": 4,
    "mixed-sizes": 4,
    "slow-neighbour": 4,
    "giant-and-medium": 8,
    "several-giants": 16,
    "staggered-giants": 32,
}
#: Cases shown but left out of the choice, and why.
LEFT_OUT = {
    ("mixed-sizes", "document"): "counted by document a 30 s scan weighs as a 1 s invoice; "
    "drr shares seconds, which no table of documents can: count by cost (docs/costs.md)",
    ("noisy-neighbour", "duration"): "documents of 50 ms counted in seconds: 20 of them count as 1",
    ("steady-burst", "duration"): "documents of 50 ms counted in seconds: 20 of them count as 1",
    ("heavy-mix", "duration"): "documents of 50 ms counted in seconds: 20 of them count as 1",
}


def hour_trace() -> Trace:
    """docs/simulate.md's worked example: 200 regular clients for an hour, a 3,000-document
    import at 10 minutes, a partner sending one a second for 5 minutes from minute 15."""
    rng = random.Random(42)
    rows = []
    for c in range(200):
        t = rng.uniform(0, 120)
        while t < 3600:
            rows.append((t, f"client{c:03d}", rng.lognormvariate(1.0, 0.6)))
            t += rng.expovariate(1 / 120)
    rows += [(600.0, "importer", rng.lognormvariate(1.0, 0.6)) for _ in range(3000)]
    rows += [(900.0 + i, "partner", rng.lognormvariate(1.0, 0.6)) for i in range(300)]
    builder = TraceBuilder()
    for t, client, seconds in sorted(rows):
        builder.add(client, "", round(t, 3), round(seconds, 3))
    return builder.build()


def cases() -> tuple[list[Case], list[tuple[Case, str]]]:
    """(the cases the choice is made on, the cases shown only with why)."""
    traces = {name: (WORKLOADS[name](DEFAULT_SEED).trace(), slots) for name, slots in WORKLOAD_SLOTS.items()}
    traces["hour (docs/simulate.md)"] = (hour_trace(), 16)
    chosen, shown = [], []
    for name, (trace, slots) in traces.items():
        for cost in ("document", "duration"):
            counted = counted_by(trace, cost)
            for mode in ("seed", "inflight"):
                case = Case(f"{name}, {cost}, {mode}", counted, slots, mode)
                why = LEFT_OUT.get((name, cost))
                if why is None:
                    chosen.append(case)
                else:
                    shown.append((case, why))
    return chosen, shown


def groups_line(base: Baseline, waits: list[float]) -> str:
    """Worst light p95, worst medium p95 (and its ratio to drr's), worst heavy p95."""
    cells = []
    for group in ("light", "medium", "heavy"):
        mine = [(w, d) for g, w, d in zip(base.groups, waits, base.drr, strict=True) if g == group]
        if not mine:
            cells.append(f"{'-':>18}")
        elif group == "medium":
            worst = max(mine, key=lambda wd: wd[0] / wd[1] if wd[1] else 0)
            ratio = worst[0] / worst[1] if worst[1] else 0
            cells.append(f"{max(w for w, _ in mine):9.1f} s {ratio:5.2f}x")
        else:
            cells.append(f"{max(w for w, _ in mine):16.2f} s")
    return " ".join(cells)


def comparison(base: Baseline, wide: Policy) -> None:
    counts = {g: base.groups.count(g) for g in ("light", "medium", "heavy")}
    print(
        f"\n{base.case.name}: {len(base.case.trace)} documents, {base.case.workers} slots, clients {counts}"
    )
    print(
        f"  {'policy':8} {'light worst p95':>18} {'medium worst p95, /drr':>24} "
        f"{'heavy worst p95':>18}  score"
    )
    rows = {
        "fifo": base.fifo,
        "default": base.default,
        "wide": judge(base, wide).p95,
        "drr": base.drr,
    }
    for name, waits in rows.items():
        verdict = score(base, waits)
        mark = "" if name in ("fifo", "drr") else f"  {verdict.score:.2f} ({verdict.worst})"
        print(f"  {name:8} {groups_line(base, waits)}{mark}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=8, help="how many tables of the ranking to print")
    args = parser.parse_args()
    started = time.perf_counter()
    chosen, shown = cases()
    bases = [baseline(c) for c in chosen]
    tables = candidates()
    ranked = search(bases, tables)
    took = time.perf_counter() - started
    print(
        f"{len(tables)} tables x {len(chosen)} cases in {took:.1f} s; a table's score: its worst over "
        "the cases, 1.0 at the bounds"
    )
    for r in ranked[: args.top]:
        print(f"  {r.score:6.3f}  meets {r.passed:2}/{len(chosen)}  {rows_text(r.table)}")
    default = search(bases, [DEFAULT_THRESHOLDS])[0]
    print(f"  the scheme's table: {default.score:.3f}, meets {default.passed}/{len(chosen)}")
    chosen_one = choose(ranked)
    best = chosen_one.table
    print(
        f"chosen (the most cases met within 5% of the best worst score): {chosen_one.score:.3f}, "
        f"meets {chosen_one.passed}/{len(chosen)}, {rows_text(best)}"
    )
    same = "is" if best == WIDE_THRESHOLDS else "is NOT"
    print(f"the chosen table {same} thresholds='wide' ({rows_text(WIDE_THRESHOLDS)})")
    print("\ncases the chosen table misses:")
    for case, verdict in zip(chosen, chosen_one.verdicts, strict=True):
        if verdict.score > 1.0:
            print(f"  {case.name}: {verdict.score:.3f} ({verdict.worst})")
    for base in bases:
        comparison(base, WIDE_THRESHOLDS)
    print("\nshown, not used for the choice:")
    for case, why in shown:
        print(f"  ({why})", end="")
        comparison(baseline(case), WIDE_THRESHOLDS)


if __name__ == "__main__":
    main()
