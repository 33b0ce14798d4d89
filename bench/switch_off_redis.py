"""Switching the router off on Redis: what plain workers run with and without ``migrate``.

Router publishers queue ``--clients`` clients' documents (``--docs`` each, so every
client's burst goes through all nine priorities), then the router comes off: plain Celery
workers start on the queue.  Without ``migrate`` they poll kombu's four lists and leave
the others' documents where they are; with ``priority-router migrate QUEUE --to plain``
run while they consume, every document runs.  It reports the documents run, run twice and
left waiting, and how long the move took.

    python bench/switch_off_redis.py                  # 40 clients x 25 documents = 1,000
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import redis  # noqa: E402

from workers.app import create_app  # noqa: E402
from workers.local_redis import RedisDatabases, redis_or_embedded  # noqa: E402
from workers.services import Worker, worker_environment  # noqa: E402

TASK = "workers.sleep_document"
_SUCCEEDED = re.compile(r"Task workers\.sleep_document\[([0-9a-f-]+)\] succeeded")
SEP = "\x06\x16"


def run(with_migrate: bool, args: argparse.Namespace, dbs: RedisDatabases) -> dict[str, float]:
    queue = f"bench-switch-off-{uuid.uuid4().hex[:8]}"
    env = {
        "BROKER_URL": dbs.broker,
        "DOCUMENT_QUEUE": queue,
        "PRIORITY_ROUTER_REDIS_URL": dbs.counter,
        "PRIORITY_ROUTER_KEY_PREFIX": f"{queue}:",
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
    }
    publisher = create_app(env)
    ids = {
        publisher.send_task(
            TASK, (f"c{c}", f"c{c}-{n}", args.doc_ms / 1000), headers={"client_id": f"c{c}"}
        ).id
        for c in range(args.clients)
        for n in range(args.docs)
    }
    publisher.close()
    broker = redis.Redis.from_url(dbs.broker)
    lists = [queue, *(f"{queue}{SEP}{step}" for step in range(1, 10))]
    by_priority = [int(broker.llen(name)) for name in lists]
    worker = Worker(
        {**env, "WORKERS_ROUTER": "off"}, "-P", "threads", "-c", str(args.concurrency), "-Q", queue
    )
    move_seconds = float("nan")
    try:
        worker.wait_ready()
        if with_migrate:
            started = time.perf_counter()
            command = [sys.executable, "-m", "priority_router", "migrate", queue, "--to", "plain"]
            subprocess.run(
                [*command, "-b", dbs.broker], check=True, env=worker_environment({}), capture_output=True
            )
            move_seconds = time.perf_counter() - started
        last, seen = time.monotonic(), 0
        while time.monotonic() - last < args.quiet:
            count = len(_SUCCEEDED.findall(worker.output()))
            if count != seen:
                seen, last = count, time.monotonic()
            if count >= len(ids):
                break
            time.sleep(0.2)
        runs = collections.Counter(_SUCCEEDED.findall(worker.output()))
    finally:
        worker.stop()
    left = sum(int(broker.llen(name)) for name in lists)
    broker.delete(*lists)
    broker.close()
    return {
        "published": len(ids),
        "by_priority": by_priority,  # type: ignore[dict-item]
        "ran": len(set(runs) & ids),
        "twice": sum(1 for n in runs.values() if n > 1),
        "left": left,
        "move_seconds": move_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=40)
    parser.add_argument("--docs", type=int, default=25, help="documents per client")
    parser.add_argument("--doc-ms", type=float, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--quiet", type=float, default=5, help="seconds without a new run that end a run")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379", help="Redis server (db: the first of 3)")
    args = parser.parse_args()
    redis_url, stop_redis = redis_or_embedded(args.redis.rstrip("/"))
    dbs = RedisDatabases.from_url(args.redis).on(redis_url)
    try:
        print("| switch-off | published | waiting per list 0..9 | ran | ran twice | left waiting | move |")
        print("|---|---|---|---|---|---|---|")
        for with_migrate in (False, True):
            r = run(with_migrate, args, dbs)
            name = "plain workers + migrate --to plain" if with_migrate else "plain workers only"
            move = "-" if r["move_seconds"] != r["move_seconds"] else f"{r['move_seconds']:.2f} s"
            print(
                f"| {name} | {r['published']} | {r['by_priority']} | {r['ran']} | {r['twice']} | "
                f"{r['left']} | {move} |",
                flush=True,
            )
    finally:
        stop_redis()


if __name__ == "__main__":
    main()
