"""Starvation: does a heavy client's backlog wait for as long as light clients keep coming?

One heavy client sends ``--heavy`` documents at once (priorities 1 to 9); then a new light
client (priority 1) sends one document every ``1 / --rate`` seconds for ``--stream``
seconds.  A real worker with ``--threads`` threads runs documents that hold a slot for
``--doc-ms``; the stream asks for more than the worker can do, so without ``max_wait`` the
heavy client's less urgent documents wait until the stream ends.  The same workload runs
with the strict router and with ``max_wait``, in the same run, on the same Redis broker
(alternating with ``--repeat``).

    python bench/starvation.py                 # strict vs max_wait=3
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


def run(max_wait: float | None, args: argparse.Namespace, redis_url: str) -> dict[str, Any]:
    env = {
        "BROKER_URL": RedisDatabases.from_url(redis_url).broker,
        "RESULT_BACKEND": RedisDatabases.from_url(redis_url).results,
        "DOCUMENT_QUEUE": f"bench-starve-{uuid.uuid4().hex[:6]}",
        "PRIORITY_ROUTER_REDIS_URL": RedisDatabases.from_url(redis_url).counter,
        "PRIORITY_ROUTER_KEY_PREFIX": f"bench-{uuid.uuid4().hex[:6]}:",
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
    }
    if max_wait is not None:
        env["PRIORITY_ROUTER_MAX_WAIT"] = repr(max_wait)
    app = create_app(env)
    light = round(args.rate * args.stream)
    workload = NoisyNeighbour(
        heavy=args.heavy,
        light_clients=light,  # every light document comes from a new client
        light_docs=1,
        doc_seconds=args.doc_ms / 1000,
        jitter=0.0,
        light_start=0.05,
        light_spread=args.stream,
    )
    with running_worker(env, "--pool", "threads", "--concurrency", str(args.threads)):
        published = publish(app, workload)
        results = {tid: app.AsyncResult(tid).get(timeout=300) for tid in published}
    app.close()

    waits = waits_by_group(published, results)
    return {
        "mode": "strict" if max_wait is None else f"max_wait={max_wait:g}",
        "processed": len(results),
        "published": len(published),
        "heavy_max": max(waits["heavy"]),
        "light_p50": statistics.median(waits["light"]),
        "light_p95": p95(waits["light"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
    parser.add_argument("--max-wait", type=float, default=3.0)
    parser.add_argument("--heavy", type=int, default=25)
    parser.add_argument("--rate", type=float, default=50, help="light documents per second")
    parser.add_argument("--stream", type=float, default=15, help="seconds the light stream lasts")
    parser.add_argument("--threads", type=int, default=2, help="worker concurrency (threads pool)")
    parser.add_argument("--doc-ms", type=float, default=50, help="document length")
    parser.add_argument("--repeat", type=int, default=1, help="run both modes this many times, alternating")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    redis_url, stop_redis = redis_or_embedded(args.redis.rstrip("/"))
    started = time.monotonic()
    try:
        pairs = [
            (run(None, args, redis_url), run(args.max_wait, args, redis_url))
            for _ in range(max(1, args.repeat))
        ]
    finally:
        stop_redis()

    if args.json:
        print(json.dumps([row for pair in pairs for row in pair], indent=2))
        return
    print(
        f"heavy={args.heavy} then {args.rate:g} light docs/s for {args.stream:g} s; "
        f"threads={args.threads} doc={args.doc_ms:.0f} ms; {time.monotonic() - started:.0f} s in all"
    )
    print("| run | heavy longest wait | every document ran | light p50 | light p95 |")
    print("|---|---|---|---|---|")
    for pair in pairs:
        for r in pair:
            ran = "yes" if r["processed"] == r["published"] else "NO"
            print(
                f"| {r['mode']} | {r['heavy_max']:.2f} s | {ran} ({r['processed']}/{r['published']}) | "
                f"{r['light_p50'] * 1000:.0f} ms | {r['light_p95'] * 1000:.0f} ms |"
            )
    ratios = [bounded["light_p50"] / strict["light_p50"] for strict, bounded in pairs]
    print(
        f"light p50 max_wait/strict: median {statistics.median(ratios):.2f}x "
        f"(range {min(ratios):.2f}-{max(ratios):.2f}x)"
    )


if __name__ == "__main__":
    main()
