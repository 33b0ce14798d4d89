"""Worker pools: the noisy neighbour on each pool, plain Celery against the router.

The same workload (``--heavy`` documents of one client, then ``--light`` clients with one
document each, every one waiting ``--doc-ms`` on I/O) is published before a real worker
starts, then drained by ``celery worker -P POOL -c N``, plain Celery and the router
alternating ``--repeat`` times on the same broker.  It reports the drain time (the first
document's start to the last one's end), the throughput ratio router/plain, the light clients' p95
wait from the first start, documents run more than once and the worker's CRITICAL lines.  The task keeps
Celery's default early acks, as most projects' tasks do; the router makes them late.

    python bench/pools.py                                   # gevent, eventlet, threads, prefork
    python bench/pools.py --pools gevent --broker amqp://guest:guest@127.0.0.1:5672//
    python bench/pools.py --pools gevent --without-pool-settings

``--without-pool-settings`` gives the router's worker the values a green pool on Redis must
not have, set as a user's own so that the router keeps them (and warns): a prefetch
multiplier of 1 and kombu's default ``max_connections`` of 10 (``bench/short_app.py``).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from workers.app import create_app  # noqa: E402
from workers.local_redis import (  # noqa: E402
    RedisDatabases,
    redis_or_embedded,
    stop_process,
)
from workers.services import Worker  # noqa: E402
from workers.workload import p95  # noqa: E402

CONCURRENCY = {"gevent": 20, "eventlet": 20, "threads": 8, "prefork": 2, "solo": 1}
TASK = "workers.sleep_document"
_SUCCEEDED = re.compile(r"Task workers\.sleep_document\[([0-9a-f-]+)\] succeeded")


def run(mode: str, pool: str, args: argparse.Namespace, dbs: RedisDatabases) -> dict[str, float]:
    env = {
        "BROKER_URL": args.broker or dbs.broker,
        "RESULT_BACKEND": dbs.results,
        "DOCUMENT_QUEUE": f"bench-pools-{uuid.uuid4().hex[:8]}",
        "PRIORITY_ROUTER_REDIS_URL": dbs.counter,
        "PRIORITY_ROUTER_KEY_PREFIX": f"bench-pools-{uuid.uuid4().hex[:8]}:",
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
        "WORKERS_ROUTER": "on" if mode == "router" else "off",
    }
    worker_app = "workers.app"
    if mode == "router" and args.without_pool_settings:
        env["CELERY_SETTINGS"] = json.dumps({"worker_prefetch_multiplier": 1})
        env["BROKER_TRANSPORT_OPTIONS"] = json.dumps({"max_connections": 10})
        worker_app = "bench.short_app"
    app = create_app(env)
    seconds = args.doc_ms / 1000
    published: dict[str, tuple[str, float]] = {}
    for n in range(args.heavy):
        r = app.send_task(TASK, ("heavy", f"h{n}", seconds), headers={"client_id": "heavy"})
        published[r.id] = ("heavy", time.time())
    for n in range(args.light):
        r = app.send_task(TASK, (f"light{n}", f"l{n}", seconds), headers={"client_id": f"light{n}"})
        published[r.id] = ("light", time.time())
    worker = Worker(env, "--pool", pool, "--concurrency", str(CONCURRENCY[pool]), app=worker_app)
    try:
        worker.wait_ready()
        results = {tid: app.AsyncResult(tid).get(timeout=args.timeout) for tid in published}
        # The worker's own clock: from its first document's start to its last one's end.
        first = min(r["started_at"] for r in results.values())
        done = max(r["finished_at"] for r in results.values())
        time.sleep(1.0)  # a document delivered again would run by now
        stop_process(worker.process, timeout=30)
        log = worker.output()
    finally:
        worker.stop()
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(env["DOCUMENT_QUEUE"])
        for tid in published:
            app.AsyncResult(tid).forget()
        app.close()
    runs = collections.Counter(_SUCCEEDED.findall(log))
    light = [results[t]["started_at"] - first for t, (g, _) in published.items() if g == "light"]
    return {
        "drain": done - first,
        "light_p95": p95(light),
        "twice": sum(1 for n in runs.values() if n > 1),
        "critical": log.count("CRITICAL"),
    }


def _row(pool: str, got: dict[str, list[dict[str, float]]]) -> str:
    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in got[mode])

    def each(mode: str, key: str) -> str:
        return "/".join(str(int(r[key])) for r in got[mode])

    def spread(mode: str, key: str, scale: float = 1.0) -> str:
        values = [r[key] * scale for r in got[mode]]
        return (
            f"({min(values):.2f}-{max(values):.2f})"
            if scale == 1.0
            else f"({min(values):.0f}-{max(values):.0f})"
        )

    ratio = med("plain", "drain") / med("router", "drain")
    ratios = [p["drain"] / r["drain"] for p, r in zip(got["plain"], got["router"], strict=True)]
    cells = [
        f"{pool} -c {CONCURRENCY[pool]}",
        f"{med('plain', 'drain'):.2f} s {spread('plain', 'drain')}",
        f"{med('router', 'drain'):.2f} s {spread('router', 'drain')}",
        f"{ratio:.2f}x (each round {min(ratios):.2f}-{max(ratios):.2f}x)",
        f"{med('plain', 'light_p95') * 1000:.0f} ms {spread('plain', 'light_p95', 1000)}",
        f"{med('router', 'light_p95') * 1000:.0f} ms {spread('router', 'light_p95', 1000)}",
        f"{each('plain', 'twice')} / {each('router', 'twice')}",
        f"{each('plain', 'critical')} / {each('router', 'critical')}",
    ]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pools", default="gevent,eventlet,threads,prefork")
    parser.add_argument("--broker", default=None, help="broker URL (default: the bench Redis)")
    parser.add_argument("--heavy", type=int, default=100)
    parser.add_argument("--light", type=int, default=10)
    parser.add_argument("--doc-ms", type=float, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379", help="Redis server (db: the first of 3)")
    parser.add_argument(
        "--without-pool-settings",
        action="store_true",
        help="the router's worker with the user's prefetch multiplier 1 and max_connections 10",
    )
    args = parser.parse_args()
    redis_url, stop_redis = redis_or_embedded(args.redis.rstrip("/"))
    dbs = RedisDatabases.from_url(args.redis).on(redis_url)
    try:
        print(
            "| pool | plain drain | router drain | throughput router/plain | plain light p95 | "
            "router light p95 | run twice (plain / router) | CRITICAL (plain / router) |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for pool in args.pools.split(","):
            got: dict[str, list[dict[str, float]]] = {"plain": [], "router": []}
            for _ in range(args.repeat):
                for mode in ("plain", "router"):
                    try:
                        got[mode].append(run(mode, pool, args, dbs))
                    except Exception as exc:  # a collapsed run is a result too
                        print(f"  {pool} {mode}: {type(exc).__name__}: {exc}", file=sys.stderr)
                        got[mode].append(
                            {"drain": float("inf"), "light_p95": float("inf"), "twice": -1, "critical": -1}
                        )

            print(_row(pool, got), flush=True)
    finally:
        stop_redis()


if __name__ == "__main__":
    main()
