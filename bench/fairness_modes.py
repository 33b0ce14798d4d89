"""Fairness by counting mode: FIFO, seed and inflight, each with and without max_wait.

Two workloads (``workers/workload.py``), on a real worker (``--threads`` threads) on the
Redis broker, documents holding a slot for ``--doc-ms`` on average (uniform in
doc-ms * (1 +/- jitter), the same seeded lengths in every run):

- steady+burst: a steady client sends ``--steady`` documents one at a time (the next when
  the previous one has finished); before its ``--burst-after``-th, a bursting client dumps
  ``--burst`` documents at once;
- heavy mix: heavy clients dump ``--heavy`` documents each (largest first, ``--heavy-gap``
  seconds apart), and ``--light-clients`` clients send ``--light-docs`` each, spread over
  ``--light-spread`` seconds.

Configurations: fifo (plain Celery, ``WORKERS_ROUTER=off``), seed, seed+max_wait, inflight,
inflight+max_wait (``PRIORITY_ROUTER_MODE``, ``PRIORITY_ROUTER_MAX_WAIT=--max-wait``; the
worker and the publisher get the same settings).  Each repeat runs every configuration in
turn; the tables show medians over ``--repeat``.

Metrics of a run (waits are the worker's ``started_at`` minus the publisher's clock when
``send_task`` returned, as in ``bench/fairness.py``; service is ``finished_at - started_at``):

- light p50 / p95 / max: waits of the light documents (the steady client; the light
  clients); the max shows the one steady document that meets the whole burst under FIFO,
  which p95 of 30 documents does not;
- each heavy client's longest wait;
- makespan: the first publish to the last finish;
- Jain: J = (sum x)^2 / (n * sum x^2) over all n clients of the workload, where a client's
  slowdown is x = mean(wait + service) / mean(service) over its documents.

    python bench/fairness_modes.py                 # both workloads, 1 repeat, about 1 minute
    python bench/fairness_modes.py --repeat 2      # the README's tables, about 2 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from workers.app import create_app  # noqa: E402
from workers.local_redis import RedisDatabases, redis_or_embedded  # noqa: E402
from workers.services import running_worker  # noqa: E402
from workers.workload import (  # noqa: E402
    HeavyMix,
    Sent,
    SteadyBurst,
    jain,
    p95,
    publish_steady_burst,
    publish_timed,
    slowdown,
)

#: name -> (router on, mode, uses max_wait)
CONFIGS: dict[str, tuple[bool, str, bool]] = {
    "fifo": (False, "seed", False),
    "seed": (True, "seed", False),
    "seed+max_wait": (True, "seed", True),
    "inflight": (True, "inflight", False),
    "inflight+max_wait": (True, "inflight", True),
}


def run(workload_name: str, config: str, args: argparse.Namespace, redis_url: str) -> dict[str, Any]:
    router, mode, bounded = CONFIGS[config]
    env = {
        "BROKER_URL": RedisDatabases.from_url(redis_url).broker,
        "RESULT_BACKEND": RedisDatabases.from_url(redis_url).results,
        "DOCUMENT_QUEUE": f"bench-modes-{uuid.uuid4().hex[:6]}",
        "WORKERS_ROUTER": "on" if router else "off",
        "PRIORITY_ROUTER_REDIS_URL": RedisDatabases.from_url(redis_url).counter,
        "PRIORITY_ROUTER_KEY_PREFIX": f"bench-{uuid.uuid4().hex[:6]}:",
        "PRIORITY_ROUTER_MODE": mode,
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
    }
    if bounded:
        env["PRIORITY_ROUTER_MAX_WAIT"] = repr(args.max_wait)
    app = create_app(env)
    with running_worker(env, "--pool", "threads", "--concurrency", str(args.threads)):
        start = time.time()
        sent: Sent
        if workload_name == "steady+burst":
            steady = SteadyBurst(
                steady=args.steady,
                burst=args.burst,
                burst_after=args.burst_after,
                doc_seconds=args.doc_ms / 1000,
                jitter=args.jitter,
                seed=args.seed,
            )
            sent = publish_steady_burst(app, steady)
        else:
            mix = HeavyMix(
                heavy=tuple(args.heavy),
                heavy_gap=args.heavy_gap,
                light_clients=args.light_clients,
                light_docs=args.light_docs,
                light_spread=args.light_spread,
                doc_seconds=args.doc_ms / 1000,
                jitter=args.jitter,
                seed=args.seed,
            )
            sent = publish_timed(app, mix.documents())
        results = {tid: app.AsyncResult(tid).get(timeout=300) for tid in sent}
    app.close()

    light: list[float] = []
    waits: dict[str, list[float]] = defaultdict(list)
    services: dict[str, list[float]] = defaultdict(list)
    heavy_max: dict[str, float] = {}
    for tid, (doc, at) in sent.items():
        report = results[tid]
        wait = report["started_at"] - at
        waits[doc.client_id].append(wait)
        services[doc.client_id].append(report["finished_at"] - report["started_at"])
        if doc.group == "light":
            light.append(wait)
        else:
            heavy_max[doc.client_id] = max(wait, heavy_max.get(doc.client_id, 0.0))
    return {
        "workload": workload_name,
        "config": config,
        "processed": len(results),
        "published": len(sent),
        "light_p50": statistics.median(light),
        "light_p95": p95(light),
        "light_max": max(light),
        "heavy_max": heavy_max,
        "makespan": max(r["finished_at"] for r in results.values()) - start,
        "jain": jain([slowdown(waits[c], services[c]) for c in waits]),
        "slowdowns": {c: round(slowdown(waits[c], services[c]), 2) for c in waits},
    }


def medians(rows: list[dict[str, Any]]) -> dict[str, Any]:
    first = rows[0]
    return {
        "workload": first["workload"],
        "config": first["config"],
        "runs": len(rows),
        "all_processed": all(r["processed"] == r["published"] for r in rows),
        "processed": f"{sum(r['processed'] for r in rows)}/{sum(r['published'] for r in rows)}",
        **{
            k: statistics.median(r[k] for r in rows)
            for k in ("light_p50", "light_p95", "light_max", "makespan", "jain")
        },
        "heavy_max": {c: statistics.median(r["heavy_max"][c] for r in rows) for c in first["heavy_max"]},
        "jain_range": [min(r["jain"] for r in rows), max(r["jain"] for r in rows)],
    }


def heavy_label(workload: str, client: str, args: argparse.Namespace) -> str:
    if workload == "steady+burst":
        return f"burst ({args.burst})"
    return f"{client} ({args.heavy[int(client.removeprefix('heavy'))]})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
    parser.add_argument(
        "--workload", choices=["steady+burst", "heavy-mix", "both"], default="both", help="what to run"
    )
    parser.add_argument(
        "--configs", default=",".join(CONFIGS), help="comma-separated, of " + ", ".join(CONFIGS)
    )
    parser.add_argument("--max-wait", type=float, default=1.0, help="seconds, for the +max_wait configs")
    parser.add_argument("--steady", type=int, default=30, help="the steady client's documents")
    parser.add_argument("--burst", type=int, default=150, help="the bursting client's documents")
    parser.add_argument("--burst-after", type=int, default=5, help="steady documents before the burst")
    parser.add_argument("--heavy", type=int, nargs="+", default=[120, 60, 30], help="heavy clients' sizes")
    parser.add_argument("--heavy-gap", type=float, default=0.5, help="seconds between heavy dumps")
    parser.add_argument("--light-clients", type=int, default=8)
    parser.add_argument("--light-docs", type=int, default=2)
    parser.add_argument("--light-spread", type=float, default=2.5, help="seconds the light docs span")
    parser.add_argument("--threads", type=int, default=4, help="worker concurrency (threads pool)")
    parser.add_argument("--doc-ms", type=float, default=50, help="mean document length")
    parser.add_argument("--jitter", type=float, default=0.5, help="lengths uniform in doc-ms*(1 +/- jitter)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=1, help="run every configuration this many times")
    args = parser.parse_args()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configs {unknown}; use {', '.join(CONFIGS)}")
    workloads = ["steady+burst", "heavy-mix"] if args.workload == "both" else [args.workload]

    redis_url, stop_redis = redis_or_embedded(args.redis.rstrip("/"))
    began = time.monotonic()
    rows: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    try:
        for _ in range(max(1, args.repeat)):
            for workload in workloads:
                for config in configs:  # configurations alternate within each repeat
                    rows[workload, config].append(run(workload, config, args, redis_url))
    finally:
        stop_redis()

    print(
        f"threads={args.threads} doc={args.doc_ms:.0f} ms +/- {args.jitter:.0%} max_wait={args.max_wait:g} s "
        f"repeat={max(1, args.repeat)} (medians); {time.monotonic() - began:.0f} s in all"
    )
    summary = []
    for workload in workloads:
        if workload == "steady+burst":
            print(
                f"\nsteady+burst: steady client {args.steady} one at a time; burst of {args.burst} "
                f"after its first {args.burst_after}; light = the steady client"
            )
        else:
            print(
                f"\nheavy mix: heavy clients {'+'.join(map(str, args.heavy))} at once, "
                f"{args.heavy_gap:g} s apart; light = {args.light_clients} clients x {args.light_docs} "
                f"over {args.light_spread:g} s"
            )
        table = [medians(rows[workload, config]) for config in configs]
        summary += table
        heavies = list(table[0]["heavy_max"])
        labels = [f"{heavy_label(workload, c, args)} longest wait" for c in heavies]
        print(
            "| config | light p50 | light p95 | light max | "
            + " | ".join(labels)
            + " | makespan | Jain | processed |"
        )
        print("|---|---|---|---|" + "---|" * len(labels) + "---|---|---|")
        for r in table:
            heavy = " | ".join(f"{r['heavy_max'][c]:.2f} s" for c in heavies)
            print(
                f"| {r['config']} | {r['light_p50'] * 1000:.0f} ms | {r['light_p95'] * 1000:.0f} ms | "
                f"{r['light_max'] * 1000:.0f} ms | "
                f"{heavy} | {r['makespan']:.2f} s | {r['jain']:.3f} | {r['processed']} |"
            )
    print(json.dumps({"medians": summary, "runs": [r for rs in rows.values() for r in rs]}))


if __name__ == "__main__":
    main()
