"""Switching a live RabbitMQ queue to the router and back: does every document run once,
and how long are publishes held?

For each direction (``--to router``, then ``--to plain``) on a vhost of its own:

1. the queue exists as the old kind (plain for ``--to router``, priority for ``--to
   plain``) with ``--documents`` documents waiting, published by the old kind's app;
2. a worker of the old kind consumes it (threads pool, ``--old-concurrency``), so it holds
   prefetched documents when the migration starts;
3. a publisher process with the router installed sends ``--rate`` documents per second
   throughout (for ``--to router`` the router is on the publishers first, so they publish
   to the plain queue meanwhile);
4. ``priority-router migrate QUEUE --to ... -A workers.app`` runs as the operator runs it;
5. the publisher goes on for ``--after`` seconds, stops, the old worker is stopped and
   workers of the new kind run what waits.

Reported: documents that ran once, twice or never (from the workers' own logs), how long
the command took, the longest publish during it (the publish stall) and how many
publishes it held, and what the publish hook's pause check costs when no migration runs.
The counter store is a throwaway ``redis-server``, so no other Redis user can disturb it.

    python bench/rabbitmq_adoption.py [--quick] [--documents 1000] [--rate 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import timeit
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from bench.provenance import code_version  # noqa: E402
from workers.local_redis import start_embedded_redis  # noqa: E402
from workers.rabbitmq_migration import Publisher, publish_backlog, ran, run_migrate  # noqa: E402
from workers.services import Worker, ensure_rabbitmq, temporary_vhost  # noqa: E402

#: A publish that took longer than this was held (an ordinary one takes a few ms).
HELD = 0.1


def one_direction(target: str, args: argparse.Namespace, amqp_url: str, redis_url: str) -> dict[str, Any]:
    from workers.app import create_app

    tag = uuid.uuid4().hex[:6]
    queue = f"adoption-{tag}"
    env = {
        "BROKER_URL": amqp_url,
        "DOCUMENT_QUEUE": queue,
        "PRIORITY_ROUTER_REDIS_URL": redis_url,
        "PRIORITY_ROUTER_KEY_PREFIX": f"adoption-{tag}:",
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
    }
    old_router = target == "plain"
    old_env = {**env, "WORKERS_ROUTER": "on" if old_router else "off"}
    new_env = {**env, "WORKERS_ROUTER": "off" if old_router else "on"}
    processes: list[Any] = []
    workdir = Path(tempfile.mkdtemp(prefix="pr-adoption-"))
    try:
        app = create_app(old_env)
        backlog = publish_backlog(app, args.documents, tag, args.doc_seconds)
        app.close()
        old = Worker(old_env, "-P", "threads", "-c", str(args.old_concurrency))
        processes.append(old)
        old.wait_ready()
        publisher = Publisher({**env, "WORKERS_ROUTER": "on", "PUBLISHER_TAG": tag}, workdir, args.rate)
        processes.append(publisher)
        publisher.wait_ready()
        time.sleep(args.before)

        started = time.monotonic()
        done, report, took = run_migrate({**env, "WORKERS_ROUTER": "on"}, queue, target, "--json")
        ended = started + took
        if done.returncode != 0:
            raise SystemExit(f"migrate --to {target} failed:\n{done.stdout}\n{done.stderr}")
        time.sleep(args.after)
        publisher.finish()
        sent = publisher.publishes()
        old_log = old.output()
        old.stop()
        processes.remove(old)

        new = Worker(new_env, "-P", "threads", "-c", str(args.new_concurrency))
        processes.append(new)
        new.wait_ready()
        wanted = set(backlog) | {s.task_id for s in sent}
        deadline = time.monotonic() + args.timeout
        while not set(ran(old_log, new.output())) >= wanted and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1)  # a document run twice would show by now
        runs = ran(old_log, new.output())
        during = [s.seconds for s in sent if started <= s.started + s.seconds and s.started <= ended]
        outside = [s.seconds for s in sent if s.started > ended or s.started + s.seconds < started]
        steps = {s["action"]: s["detail"] for s in report["steps"]}
        return {
            "to": target,
            "backlog": len(backlog),
            "published live": len(sent),
            "ran once": sum(1 for d in wanted if runs[d] == 1),
            "ran twice or more": sum(1 for d in wanted if runs[d] > 1),
            "never ran": sum(1 for d in wanted if runs[d] == 0),
            "ran by the old worker": len(set(ran(old_log)) & wanted),
            "migrate seconds": round(took, 2),
            "moved": report["moved"],
            "publishes during it": len(during),
            "held (> 0.1 s)": sum(1 for s in during if s > HELD),
            "longest publish stall s": round(max(during, default=0.0), 3),
            "median publish ms outside": round(1000 * statistics.median(outside), 2) if outside else None,
            "old worker said": [
                line.split("] ", 1)[-1] for line in old_log.splitlines() if "Canceling" in line
            ],
            "paused for": steps.get("resumed publishers", ""),
        }
    finally:
        for process in processes:
            process.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        try:
            from kombu import Connection

            with Connection(amqp_url) as conn:
                conn.default_channel.queue_delete(queue)
        except Exception:
            pass


def check_cost(redis_url: str) -> dict[str, float]:
    """What the pause check adds to a publish when no migration runs: the in-memory check
    every publish makes, and the one read per second a publishing process makes."""
    import redis
    from celery import Celery

    from priority_router.integration.publisher_pause import REFRESH, PublishPause

    client = redis.Redis.from_url(redis_url)
    app = Celery("cost", broker="amqp://guest@127.0.0.1:1//", set_as_current=False)
    pause = PublishPause(app, lambda: (client, f"cost-{uuid.uuid4().hex[:6]}:"))
    pause.hold("", "documents", [])
    calls = 200_000
    per_check = min(timeit.repeat(lambda: pause.hold("", "documents", []), number=calls, repeat=5)) / calls
    reads = []
    for _ in range(200):
        pause._next_read = 0.0
        before = time.perf_counter()
        pause.hold("", "documents", [])
        reads.append(time.perf_counter() - before)
    client.close()
    return {
        "check per publish ns": round(per_check * 1e9, 1),
        "read per refresh us": round(statistics.median(reads) * 1e6, 1),
        "refresh every s": REFRESH,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--amqp",
        default=os.environ.get("PRIORITY_ROUTER_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    )
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=50.0, help="live publishes per second")
    parser.add_argument("--doc-seconds", type=float, default=0.05, help="how long each document runs")
    parser.add_argument("--old-concurrency", type=int, default=1, help="the old worker's threads")
    parser.add_argument("--new-concurrency", type=int, default=16, help="the new workers' threads")
    parser.add_argument(
        "--before", type=float, default=3.0, help="seconds of publishing before the migration"
    )
    parser.add_argument("--after", type=float, default=3.0, help="seconds of publishing after it")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--targets", default="router,plain")
    parser.add_argument("--quick", action="store_true", help="200 documents, 1 s before and after")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.documents, args.before, args.after = 200, 1.0, 1.0
    missing = ensure_rabbitmq(args.amqp)
    if missing:
        raise SystemExit(missing)
    redis_server = start_embedded_redis()
    try:
        rows = []
        with temporary_vhost(args.amqp, "pr-migrate") as url:
            for target in args.targets.split(","):
                rows.append(one_direction(target, args, url, redis_server.url + "/0"))
        cost = check_cost(redis_server.url + "/0")
    finally:
        redis_server.stop()
    if args.json:
        print(json.dumps({"code": code_version(), "runs": rows, "pause check": cost}, indent=2))
        return
    print(
        f"code {code_version()}; {args.documents} documents waiting, {args.rate:g} publishes/s "
        f"throughout, old-kind worker threads -c {args.old_concurrency}, new-kind workers threads "
        f"-c {args.new_concurrency}"
    )
    keys = [k for k in rows[0] if k not in ("old worker said", "paused for")]
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    for row in rows:
        print(f"--to {row['to']}: old worker logged {row['old worker said']}; {row['paused for']}")
    print(
        f"pause check with no migration: {cost['check per publish ns']} ns per publish, plus one read of "
        f"{cost['read per refresh us']} us every {cost['refresh every s']:g} s per publishing process"
    )


if __name__ == "__main__":
    main()
