"""What the router adds to each ``apply_async``, in Redis round trips.

``before_task_publish`` is process-wide, so plain and routed publishing cannot be
compared in one process: each measurement runs in a fresh publisher process, plain and
router alternating.  Each process also times a redis-py ``PING`` to the same Redis, so
the router's added time can be read as a number of round trips, which holds on a noisy
machine where absolute times drift.

    python bench/publish_overhead.py [--repeat 5] [--publishes 3000]
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
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def child(mode: str, redis_url: str, publishes: int) -> dict[str, Any]:
    import redis

    from workers.app import create_app

    tag = uuid.uuid4().hex[:8]
    env = {
        "BROKER_URL": f"{redis_url}/14",
        "DOCUMENT_QUEUE": f"overhead-{tag}",
        "WORKERS_ROUTER": "on" if mode == "router" else "off",
        "PRIORITY_ROUTER_REDIS_URL": f"{redis_url}/13",
        "PRIORITY_ROUTER_KEY_PREFIX": f"overhead-{tag}:",
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
    }
    app = create_app(env)
    ping = redis.Redis.from_url(f"{redis_url}/13")
    try:
        for n in range(200):  # connections, caches and the sender are built here
            app.send_task("workers.hold_document", ("warm", f"w{n}", 0), headers={"client_id": "warm"})
        pings = []
        for _ in range(2000):
            started = time.perf_counter()
            ping.ping()
            pings.append(time.perf_counter() - started)
        started = time.perf_counter()
        for n in range(publishes):
            client = f"c{n % 100}"
            app.send_task("workers.hold_document", (client, f"d{n}", 0), headers={"client_id": client})
        per_publish = (time.perf_counter() - started) / publishes
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(env["DOCUMENT_QUEUE"])
        for key in ping.scan_iter(match=f"overhead-{tag}:*"):
            ping.unlink(key)
        app.close()
    return {"mode": mode, "publish_us": per_publish * 1e6, "ping_us": statistics.median(pings) * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
    parser.add_argument("--repeat", type=int, default=5, help="plain/router pairs, alternating")
    parser.add_argument("--publishes", type=int, default=3000)
    parser.add_argument("--child", choices=["plain", "router"], help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    redis_url = args.redis.rstrip("/")
    if args.child:
        print(json.dumps(child(args.child, redis_url, args.publishes)))
        return

    rows = []
    for _ in range(max(1, args.repeat)):
        for mode in ("plain", "router"):
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    mode,
                    "--redis",
                    redis_url,
                    "--publishes",
                    str(args.publishes),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    plain = [r["publish_us"] for r in rows if r["mode"] == "plain"]
    routed = [r["publish_us"] for r in rows if r["mode"] == "router"]
    pings = [r["ping_us"] for r in rows]
    added = [b - a for a, b in zip(plain, routed, strict=True)]
    trips = [d / p for d, p in zip(added, pings[1::2], strict=True)]
    print(f"{args.repeat} alternating pairs, {args.publishes} publishes each, Redis broker")
    print("| run | plain us/publish | router us/publish | added us | PING us | added in round trips |")
    print("|---|---|---|---|---|---|")
    for i, (a, b, d, t) in enumerate(zip(plain, routed, added, trips, strict=True), 1):
        print(f"| {i} | {a:.0f} | {b:.0f} | {d:.0f} | {pings[2 * i - 1]:.0f} | {t:.2f} |")
    print(
        f"median: plain {statistics.median(plain):.0f} us, router {statistics.median(routed):.0f} us, "
        f"added {statistics.median(added):.0f} us = {statistics.median(trips):.2f} round trips"
    )


if __name__ == "__main__":
    main()
