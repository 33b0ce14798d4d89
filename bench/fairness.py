"""Noisy neighbour: does a heavy client's burst delay light clients?

One heavy client dumps ``--heavy`` documents; then ``--light-clients`` clients send
``--light-docs`` each, spread over the first second of the backlog; a real worker with
``--threads`` threads runs documents that hold a slot for ``--doc-ms`` on average
(``--jitter`` spreads lengths evenly around it, the same seeded lengths in both runs).  The same
workload runs on plain Celery and with the router, in the same run, on the same broker.

    python bench/fairness.py                       # Redis broker
    python bench/fairness.py --broker amqp://guest:guest@127.0.0.1:5672//
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from workers.app import create_app  # noqa: E402
from workers.local_redis import RedisDatabases, redis_or_embedded  # noqa: E402
from workers.services import running_worker  # noqa: E402
from workers.workload import NoisyNeighbour, p95, publish, waits_by_group  # noqa: E402

#: What one run measured: the workload, the clock before the first publish, task id ->
#: (group, publish time), and task id -> the worker's report (``started_at``, ``finished_at``).
Measured = tuple[NoisyNeighbour, float, dict[str, tuple[str, float]], dict[str, dict[str, Any]]]


def measure(mode: str, args: argparse.Namespace, redis_url: str) -> Measured:
    """Run the workload once on a real worker, plain Celery (``mode="plain"``) or with the router."""
    env = {
        "BROKER_URL": args.broker or RedisDatabases.from_url(redis_url).broker,
        "RESULT_BACKEND": RedisDatabases.from_url(redis_url).results,
        "DOCUMENT_QUEUE": f"bench-{mode}-{uuid.uuid4().hex[:6]}",
        "WORKERS_ROUTER": "on" if mode == "router" else "off",
        "PRIORITY_ROUTER_REDIS_URL": RedisDatabases.from_url(redis_url).counter,
        "PRIORITY_ROUTER_KEY_PREFIX": f"bench-{uuid.uuid4().hex[:6]}:",
    }
    app = create_app(env)
    workload = NoisyNeighbour(
        heavy=args.heavy,
        light_clients=args.light_clients,
        light_docs=args.light_docs,
        doc_seconds=args.doc_ms / 1000,
        jitter=args.jitter,
        light_start=args.light_start,
        light_spread=args.light_spread,
        seed=args.seed,  # the same document lengths in both runs
    )
    with running_worker(env, "--pool", args.pool, "--concurrency", str(args.threads)):
        start = time.time()
        published = publish(app, workload)
        results = {tid: app.AsyncResult(tid).get(timeout=300) for tid in published}
    app.close()
    return workload, start, published, results


def run(mode: str, args: argparse.Namespace, redis_url: str) -> dict[str, Any]:
    _, start, published, results = measure(mode, args, redis_url)
    waits = waits_by_group(published, results)
    return {
        "mode": mode,
        "processed": len(results),
        "published": len(published),
        "light_p50": statistics.median(waits["light"]),
        "light_p95": p95(waits["light"]),
        "heavy_p50": statistics.median(waits["heavy"]),
        "heavy_p95": p95(waits["heavy"]),
        "makespan": max(r["finished_at"] for r in results.values()) - start,
    }


def arguments(description: str | None = __doc__) -> argparse.ArgumentParser:
    """The benchmark's options (``bench/simulate_fidelity.py`` takes the same)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--broker", help="broker URL (default: the Redis below, db 14)")
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
    parser.add_argument("--heavy", type=int, default=160)
    parser.add_argument("--light-clients", type=int, default=12)
    parser.add_argument("--light-docs", type=int, default=2)
    parser.add_argument("--light-start", type=float, default=0.05, help="seconds after the burst")
    parser.add_argument("--light-spread", type=float, default=1.0, help="seconds the light docs span")
    parser.add_argument("--threads", type=int, default=4, help="worker concurrency")
    parser.add_argument("--pool", default="threads", help="worker pool: threads or prefork")
    parser.add_argument("--doc-ms", type=float, default=50, help="mean document length")
    parser.add_argument(
        "--jitter",
        type=float,
        default=0.5,
        help="lengths are uniform in doc-ms*(1 +/- jitter); 0 makes every document equal",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--repeat", type=int, default=1, help="run plain and router this many times, alternating"
    )
    parser.add_argument("--json", action="store_true")
    return parser


def main() -> None:
    args = arguments().parse_args()

    redis_url, stop_redis = redis_or_embedded(args.redis.rstrip("/"))
    try:
        pairs = [
            (run("plain", args, redis_url), run("router", args, redis_url))
            for _ in range(max(1, args.repeat))
        ]
    finally:
        stop_redis()

    if args.json:
        print(json.dumps([row for pair in pairs for row in pair], indent=2))
        return
    broker = (args.broker or redis_url).split("://")[0]
    print(
        f"broker={broker} pool={args.pool} heavy={args.heavy} "
        f"light={args.light_clients}x{args.light_docs} threads={args.threads} "
        f"doc={args.doc_ms:.0f} ms +/- {args.jitter:.0%}"
    )
    print("| run | light p50 | light p95 | heavy p50 | heavy p95 | makespan | processed |")
    print("|---|---|---|---|---|---|---|")
    for pair in pairs:
        for r in pair:
            print(
                f"| {r['mode']} | {r['light_p50'] * 1000:.0f} ms | {r['light_p95'] * 1000:.0f} ms | "
                f"{r['heavy_p50']:.2f} s | {r['heavy_p95']:.2f} s | {r['makespan']:.2f} s | "
                f"{r['processed']}/{r['published']} |"
            )
    speedups = [plain["light_p95"] / routed["light_p95"] for plain, routed in pairs]
    p95s = [routed["light_p95"] * 1000 for _, routed in pairs]
    spans = [routed["makespan"] / plain["makespan"] for plain, routed in pairs]
    print(
        f"router light p95: median {statistics.median(p95s):.0f} ms "
        f"(range {min(p95s):.0f}-{max(p95s):.0f}); "
        f"speed-up vs plain: median {statistics.median(speedups):.0f}x "
        f"(range {min(speedups):.0f}-{max(speedups):.0f}x); "
        f"makespan router/plain: median {statistics.median(spans):.3f}"
    )


if __name__ == "__main__":
    main()
