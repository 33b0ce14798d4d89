"""Giants on real workers: plain Celery, the scheme's table and ``wide``, beside the simulator.

The ``Giants`` workload of ``priority_router/simulation/workloads.py`` (the simulator's
``several-giants``, scaled down): giants dump ``--giants`` documents each, ``--giant-gap``
seconds apart; medium clients dump ``--medium`` documents each, from ``--medium-at``,
``--medium-gap`` apart; ``--light-clients`` clients send ``--light-docs`` each, evenly over
``--light-spread`` seconds from ``--light-start``.  A client is light with at most 20
documents, medium with more and at most a tenth of the largest giant's (docs/scheme.md's
groups).  Every document holds a slot for ``--doc-min-ms`` to ``--doc-max-ms`` (uniform,
seeded: the same lengths in every run), on one real worker with ``--threads`` threads.

Configurations, each repeat running every one in turn: plain (Celery's defaults,
``WORKERS_ROUTER=off``), default (the router, seed mode, the scheme's table) and wide (the
same with ``PRIORITY_ROUTER_THRESHOLDS=wide``).  A wait is the worker's ``started_at`` minus
the publisher's clock when ``send_task`` returned; the makespan runs from just before the
first publish to the last finish.  Per client group: p50, p95 and longest wait, the medians
over ``--repeat``, then the ratios of those medians.

Beside each real figure, the simulator's (``priority_router.simulation``) for the same
documents: each run replayed as ``bench/fairness.py --simulate`` replays one (the publish
times the publisher recorded, the slot times the worker reported, the run's median dispatch
gap as the overhead) on ``--threads`` slots, plain as ``fifo``, default and wide as ``seed``
with that table.  The simulator models the Redis transport; RabbitMQ serves priorities in
the same order.

Each run takes 35-38 s here (2 cores), about 110 s for the three configurations:

    python bench/giants.py                     # Redis broker, each configuration once
    python bench/giants.py --repeat 3          # docs/performance.md's tables, about 5.5 minutes
    python bench/giants.py --repeat 3 --broker amqp://guest:guest@127.0.0.1:5672//
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from bench.fairness import dispatch_gap  # noqa: E402
from priority_router.config import RouterConfig  # noqa: E402
from priority_router.simulation import TraceBuilder, build, p95, run  # noqa: E402
from priority_router.thresholds import WIDE_THRESHOLDS  # noqa: E402
from workers.app import create_app  # noqa: E402
from workers.local_redis import RedisDatabases, redis_or_embedded  # noqa: E402
from workers.services import running_worker  # noqa: E402
from workers.workload import Giants, Sent, publish_timed  # noqa: E402

#: name -> (router on, ``PRIORITY_ROUTER_THRESHOLDS``, the simulator's policy, its configuration)
CONFIGS: dict[str, tuple[bool, str, str, RouterConfig]] = {
    "plain": (False, "default", "fifo", RouterConfig()),
    "default": (True, "default", "seed", RouterConfig()),
    "wide": (True, "wide", "seed", RouterConfig(thresholds=WIDE_THRESHOLDS)),
}
#: The ratios shown: (configuration, the one it is divided by).
RATIOS = (("default", "plain"), ("wide", "plain"), ("wide", "default"))
GROUPS = ("light", "medium", "giant")
#: What a run reports, in the tables' order (seconds).
METRICS = [f"{group} {m}" for group in GROUPS for m in ("p50", "p95", "max")] + ["makespan"]
#: What each run's progress line shows.
SHOWN = ("light p95", "medium p95", "giant p95", "makespan")
#: One run's figures: metric -> seconds.
Figures = dict[str, float]


def figures(waits: dict[str, list[float]], makespan: float) -> Figures:
    out = {"makespan": makespan}
    for group in GROUPS:
        out[f"{group} p50"] = statistics.median(waits[group])
        out[f"{group} p95"] = p95(waits[group])
        out[f"{group} max"] = max(waits[group])
    return out


def measure(config: str, workload: Giants, args: argparse.Namespace, redis_url: str) -> dict[str, Any]:
    """One run on a real worker, and the simulator's replay of it."""
    router, thresholds, policy, router_config = CONFIGS[config]
    databases = RedisDatabases.from_url(redis_url)
    env = {
        "BROKER_URL": args.broker or databases.broker,
        "RESULT_BACKEND": databases.results,
        "DOCUMENT_QUEUE": f"bench-giants-{uuid.uuid4().hex[:6]}",
        "WORKERS_ROUTER": "on" if router else "off",
        "PRIORITY_ROUTER_REDIS_URL": databases.counter,
        "PRIORITY_ROUTER_KEY_PREFIX": f"bench-giants-{uuid.uuid4().hex[:6]}:",
        "PRIORITY_ROUTER_THRESHOLDS": thresholds,
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
    }
    app = create_app(env)
    with running_worker(env, "--pool", "threads", "--concurrency", str(args.threads)):
        start = time.time()
        sent: Sent = publish_timed(app, workload.documents())
        results = {tid: app.AsyncResult(tid).get(timeout=600) for tid in sent}
    app.close()

    real: dict[str, list[float]] = defaultdict(list)
    builder = TraceBuilder()
    for tid, (doc, at) in sorted(sent.items(), key=lambda item: item[1][1]):
        report = results[tid]
        real[doc.group].append(report["started_at"] - at)
        builder.add(doc.client_id, doc.group, at - start, report["finished_at"] - report["started_at"])
    trace = builder.build()
    gap = dispatch_gap({tid: at for tid, (_, at) in sent.items()}, results)
    schedule = run(trace, build(policy, router_config), args.threads, gap)
    simulated: dict[str, list[float]] = defaultdict(list)
    for i, client in enumerate(trace.client):
        simulated[trace.groups[client]].append(schedule.started[i] - schedule.published[i])
    return {
        "real": figures(real, max(r["finished_at"] for r in results.values()) - start),
        # Both clocks start just before the first publish.
        "sim": figures(simulated, max(schedule.finished)),
        "gap": gap,
    }


def workload_of(args: argparse.Namespace) -> Giants:
    return Giants(
        giants=tuple(args.giants),
        giant_gap=args.giant_gap,
        medium=tuple(args.medium),
        medium_at=args.medium_at,
        medium_gap=args.medium_gap,
        light_clients=args.light_clients,
        light_docs=args.light_docs,
        light_start=args.light_start,
        light_spread=args.light_spread,
        doc_min=args.doc_min_ms / 1000,
        doc_max=args.doc_max_ms / 1000,
        seed=args.seed,
    )


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--broker", help="broker URL (default: the Redis below, its second database)")
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
    parser.add_argument(
        "--configs", default=",".join(CONFIGS), help="comma-separated, of " + ", ".join(CONFIGS)
    )
    parser.add_argument("--giants", type=int, nargs="+", default=[600, 400], help="giants' sizes")
    parser.add_argument("--giant-gap", type=float, default=0.25, help="seconds between giants' dumps")
    parser.add_argument("--medium", type=int, nargs="+", default=[60, 50, 40, 30, 25], help="medium sizes")
    parser.add_argument("--medium-at", type=float, default=0.1, help="seconds to the first medium dump")
    parser.add_argument("--medium-gap", type=float, default=1.0, help="seconds between medium dumps")
    parser.add_argument("--light-clients", type=int, default=20)
    parser.add_argument("--light-docs", type=int, default=3)
    parser.add_argument("--light-start", type=float, default=0.1, help="seconds to the first light doc")
    parser.add_argument("--light-spread", type=float, default=30.0, help="seconds the light docs span")
    parser.add_argument("--doc-min-ms", type=float, default=50, help="shortest document")
    parser.add_argument("--doc-max-ms", type=float, default=150, help="longest document")
    parser.add_argument("--threads", type=int, default=4, help="worker concurrency (threads pool)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=1, help="run every configuration this many times")
    return parser


def main() -> None:
    parser = arguments()
    args = parser.parse_args()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configs {unknown}; use {', '.join(CONFIGS)}")
    largest = max(args.giants)
    if args.light_docs > 20 or not all(20 < m <= largest / 10 for m in args.medium):
        parser.error(f"light clients send at most 20; medium clients more than 20, at most {largest // 10}")
    workload = workload_of(args)

    redis_url, stop_redis = redis_or_embedded(args.redis.rstrip("/"))
    began = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    try:
        for n in range(max(1, args.repeat)):
            for config in configs:  # configurations alternate within each repeat
                clock = time.monotonic()
                measured = measure(config, workload, args, redis_url)
                runs[config].append(measured)
                real, sim = measured["real"], measured["sim"]
                print(
                    f"run {n + 1} {config}: {time.monotonic() - clock:.0f} s; "
                    + ", ".join(f"{m} {_show(real[m])} (sim {_show(sim[m])})" for m in SHOWN)
                    + f"; dispatch gap {measured['gap'] * 1000:.1f} ms",
                    flush=True,
                )
    finally:
        stop_redis()

    median = {
        (config, kind): {k: statistics.median(r[kind][k] for r in rows) for k in METRICS}
        for config, rows in runs.items()
        for kind in ("real", "sim")
    }
    broker = (args.broker or redis_url).split("://")[0]
    print(
        f"\nbroker={broker} threads={args.threads} giants={'+'.join(map(str, args.giants))} "
        f"medium={'+'.join(map(str, args.medium))} light={args.light_clients}x{args.light_docs} over "
        f"{args.light_spread:g} s; {workload.total} documents of {args.doc_min_ms:g}-{args.doc_max_ms:g} "
        f"ms; repeat={max(1, args.repeat)} (medians); {time.monotonic() - began:.0f} s in all"
    )
    columns = [(config, kind) for config in configs for kind in ("real", "sim")]
    _table(
        [c if kind == "real" else "sim" for c, kind in columns],
        lambda m: [_show(median[c][m]) for c in columns],
    )
    pairs = [(a, b) for a, b in RATIOS if a in runs and b in runs]
    if pairs:
        print("\nratios of the medians:")
        _table(
            [f"{a}/{b}" if kind == "real" else "sim" for a, b in pairs for kind in ("real", "sim")],
            lambda m: [
                _ratio(median[a, kind][m], median[b, kind][m]) for a, b in pairs for kind in ("real", "sim")
            ],
        )


def _table(header: list[str], cells: Callable[[str], list[str]]) -> None:
    """A markdown table, one row per metric."""
    print("| group | metric | " + " | ".join(header) + " |")
    print("|---|---|" + "---|" * len(header))
    for metric in METRICS:
        group, _, name = metric.rpartition(" ")
        print(f"| {group or '-'} | {name} | " + " | ".join(cells(metric)) + " |")


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3g}" if b else "-"


def _show(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


if __name__ == "__main__":
    main()
