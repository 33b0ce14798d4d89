"""Fidelity: does ``priority-router simulate`` agree with a real broker on the fairness workload?

Runs ``bench/fairness.py``'s workload (``--heavy`` documents dumped by one client, then
``--light-clients`` x ``--light-docs`` spread over ``--light-spread`` seconds) on a real
worker with ``--threads`` threads, plain Celery and with the router (seed mode), on the
Redis at ``--redis`` (an embedded one when none answers).  Then the simulator replays, for
each run, FIFO or seed on ``--threads`` slots:

- the run's trace: each document's publish time as the publisher recorded it, the
  time it held its slot (the worker's ``finished_at - started_at``), and the run's
  median dispatch gap as ``overhead`` (from a slot's last finish to the start of a
  document that was waiting for it: fetch, acknowledgement, hand-off);
- the workload as defined: the same documents at their nominal times and lengths, the
  burst published in no time and no overhead (what ``simulate --workload`` runs).

Prints light p95, heavy p95 and makespan for the real run and both simulations, with the
ratio simulated / real.

    python bench/simulate_fidelity.py                 # one plain and one router run, ~30 s
    python bench/simulate_fidelity.py --repeat 3
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from bench.fairness import Measured, arguments, measure  # noqa: E402
from priority_router.config import RouterConfig  # noqa: E402
from priority_router.simulation import Trace, TraceBuilder, build, p95, run  # noqa: E402
from priority_router.simulation.engine import Schedule  # noqa: E402
from workers.local_redis import redis_or_embedded  # noqa: E402

#: The real run's mode -> the simulator's policy.
POLICY = {"plain": "fifo", "router": "seed"}
METRICS = ("light p95", "heavy p95", "makespan")
HEADER = (
    "| run / policy (dispatch gap) | metric | real | sim: the run's trace | ratio "
    "| sim: the workload as defined | ratio |"
)


def real_metrics(measured: Measured) -> dict[str, float]:
    _, start, published, results = measured
    waits: dict[str, list[float]] = {"light": [], "heavy": []}
    for tid, (group, at) in published.items():
        waits[group].append(results[tid]["started_at"] - at)
    return {
        "light p95": p95(waits["light"]),
        "heavy p95": p95(waits["heavy"]),
        "makespan": max(r["finished_at"] for r in results.values()) - start,
    }


def recorded_trace(measured: Measured) -> Trace:
    """The run as it happened: publish times since the start, slot times as the worker saw them."""
    _, start, published, results = measured
    builder = TraceBuilder()
    for tid, (group, at) in sorted(published.items(), key=lambda item: item[1][1]):
        report = results[tid]
        builder.add(report["client_id"], group, at - start, report["finished_at"] - report["started_at"])
    return builder.build()


def dispatch_gap(published: Mapping[str, float], results: Mapping[str, dict[str, Any]]) -> float:
    """The median time from a slot's finish to the start of a document that waited for it,
    from task id -> publish time and task id -> the worker's report (``bench/giants.py`` too)."""
    finishes = sorted(r["finished_at"] for r in results.values())
    gaps = []
    for tid, at in published.items():
        started = results[tid]["started_at"]
        i = bisect.bisect_right(finishes, started) - 1
        if i >= 0 and finishes[i] > at:
            gaps.append(started - finishes[i])
    return statistics.median(gaps) if gaps else 0.0


def simulated_metrics(trace: Trace, policy: str, workers: int, overhead: float = 0.0) -> dict[str, float]:
    schedule: Schedule = run(trace, build(policy, RouterConfig()), workers, overhead)
    waits: dict[str, list[float]] = {"light": [], "heavy": []}
    for doc, c in enumerate(trace.client):
        waits[trace.groups[c]].append(schedule.started[doc] - schedule.published[doc])
    return {
        "light p95": p95(waits["light"]),
        "heavy p95": p95(waits["heavy"]),
        # Both clocks start just before the first publish, as the real run's does.
        "makespan": max(schedule.finished) - min(0.0, *schedule.published),
    }


def main() -> None:
    parser: argparse.ArgumentParser = arguments(__doc__)
    args = parser.parse_args()
    if args.broker and not args.broker.startswith("redis"):
        parser.error("the simulator models the Redis transport: leave --broker unset or give a redis:// URL")
    redis_url, stop_redis = redis_or_embedded(args.redis.rstrip("/"))
    rows: list[dict[str, Any]] = []
    try:
        for _ in range(max(1, args.repeat)):
            for mode in ("plain", "router"):
                measured = measure(mode, args, redis_url)
                policy = POLICY[mode]
                gap = dispatch_gap({tid: at for tid, (_, at) in measured[2].items()}, measured[3])
                rows.append(
                    {
                        "run": f"{mode} / {policy}",
                        "gap": gap,
                        "real": real_metrics(measured),
                        "recorded": simulated_metrics(recorded_trace(measured), policy, args.threads, gap),
                        "defined": simulated_metrics(measured[0].trace(), policy, args.threads),
                    }
                )
    finally:
        stop_redis()

    print(
        f"heavy={args.heavy} light={args.light_clients}x{args.light_docs} threads={args.threads} "
        f"doc={args.doc_ms:.0f} ms +/- {args.jitter:.0%} pool={args.pool}"
    )
    print(HEADER)
    print("|---|---|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {"recorded": [], "defined": []}
    for row in rows:
        for metric in METRICS:
            real = row["real"][metric]
            cells = [f"| {row['run']} ({row['gap'] * 1000:.1f} ms) | {metric} | {_show(real)}"]
            for kind in ("recorded", "defined"):
                ratio = row[kind][metric] / real
                ratios[kind].append(ratio)
                cells.append(f"{_show(row[kind][metric])} | {ratio:.2f}")
            print(" | ".join(cells) + " |")
    for kind, label in (("recorded", "the run's trace"), ("defined", "the workload as defined")):
        worst = max(ratios[kind], key=lambda r: abs(r - 1))
        within = sum(1 for r in ratios[kind] if abs(r - 1) <= 0.2)
        print(
            f"sim ({label}) / real, each run: median {statistics.median(ratios[kind]):.2f}, "
            f"furthest {worst:.2f}; {within} of {len(ratios[kind])} within 20%"
        )
    if len(rows) > len(POLICY):
        print(f"\nmedians over {len(rows) // len(POLICY)} runs of each:")
        print(HEADER.replace(" (dispatch gap)", ""))
        print("|---|---|---|---|---|---|---|")
        for run_name in dict.fromkeys(row["run"] for row in rows):
            mine = [row for row in rows if row["run"] == run_name]
            for metric in METRICS:
                real = statistics.median(row["real"][metric] for row in mine)
                cells = [f"| {run_name} | {metric} | {_show(real)}"]
                for kind in ("recorded", "defined"):
                    value = statistics.median(row[kind][metric] for row in mine)
                    cells.append(f"{_show(value)} | {value / real:.2f}")
                print(" | ".join(cells) + " |")


def _show(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


if __name__ == "__main__":
    main()
