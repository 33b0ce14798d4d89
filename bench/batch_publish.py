"""10,000 documents of one client: published one by one or as one batch, with and without
the router, in documents per second.

- ``one by one``: ``send_task`` per document;
- ``batched``: one Celery ``group`` of all documents; with the router, inside
  ``router.batch(client, n)``, which counts the whole batch in one round trip.

Every run is a fresh process (the publish signal is process-wide), the four kinds
alternate ``--repeat`` times, and medians are reported.

    python bench/batch_publish.py [--documents 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

KINDS = ("plain one by one", "plain batched", "router one by one", "router batched")


def child(kind: str, redis_url: str, documents: int) -> dict[str, Any]:
    import redis
    from celery import group

    from priority_router.router import installed_router
    from workers.app import create_app
    from workers.local_redis import RedisDatabases

    tag = uuid.uuid4().hex[:8]
    env = {
        "BROKER_URL": RedisDatabases.from_url(redis_url).broker,
        "DOCUMENT_QUEUE": f"batch-{tag}",
        "WORKERS_ROUTER": "on" if kind.startswith("router") else "off",
        "PRIORITY_ROUTER_REDIS_URL": RedisDatabases.from_url(redis_url).counter,
        "PRIORITY_ROUTER_KEY_PREFIX": f"batch-{tag}:",
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
    }
    app = create_app(env)
    router = installed_router(app)
    task = "workers.hold_document"
    headers = {"client_id": "acme"}
    try:
        for n in range(200):  # connections and the sender are built here
            app.send_task(task, ("warm", f"w{n}", 0), headers={"client_id": "warm"})
        started = time.perf_counter()
        if kind.endswith("one by one"):
            for n in range(documents):
                app.send_task(task, ("acme", f"d{n}", 0), headers=headers)
        else:
            batch = group(app.signature(task, ("acme", f"d{n}", 0)) for n in range(documents))
            if router is None:
                batch.apply_async(headers=headers)
            else:
                with router.batch("acme", documents):
                    batch.apply_async(headers=headers)
        elapsed = time.perf_counter() - started
        pending = router.peek("acme").pending if router is not None else None
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(env["DOCUMENT_QUEUE"])
        counter = redis.Redis.from_url(RedisDatabases.from_url(redis_url).counter)
        for key in counter.scan_iter(match=f"batch-{tag}:*"):
            counter.unlink(key)
        counter.close()
        app.close()
    return {"kind": kind, "docs_per_s": documents / elapsed, "pending": pending}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
    parser.add_argument("--documents", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    redis_url = args.redis.rstrip("/")
    if args.child:
        print(json.dumps(child(args.child, redis_url, args.documents)))
        return

    rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for _ in range(max(1, args.repeat)):
        for kind in KINDS:
            command = [sys.executable, __file__, "--child", kind, "--redis", redis_url]
            done = subprocess.run(
                [*command, "--documents", str(args.documents)], capture_output=True, text=True, check=True
            )
            row = json.loads(done.stdout.strip().splitlines()[-1])
            if row["pending"] is not None and row["pending"] != 1 - args.documents:
                raise SystemExit(f"{kind}: the client's count is {row['pending']}, not {1 - args.documents}")
            rates[kind].append(row["docs_per_s"])
    medians = {kind: statistics.median(values) for kind, values in rates.items()}
    print(f"{args.documents} documents of one client, Redis broker, {args.repeat} alternating runs, medians")
    print("| publishing | documents/s | range | vs plain, same way | each round vs its plain |")
    print("|---|---|---|---|---|")
    for kind in KINDS:
        plain = rates["plain " + kind.split(" ", 1)[1]]
        ratios = [r / p for r, p in zip(rates[kind], plain, strict=True)]
        print(
            f"| {kind} | {medians[kind]:.0f} | {min(rates[kind]):.0f}-{max(rates[kind]):.0f} | "
            f"{medians[kind] / statistics.median(plain):.2f}x | {min(ratios):.2f}-{max(ratios):.2f}x |"
        )
    print(json.dumps({"medians": medians, "runs": rates}))


if __name__ == "__main__":
    main()
