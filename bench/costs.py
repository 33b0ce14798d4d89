"""Counting each document by its cost, with real workers: big scans and small invoices.

The issue's trace scaled down ten times: one client sends ``--scans`` documents of
``--scan-seconds`` at t=0, and ``--clients`` clients send ``--invoices`` documents of
``--invoice-seconds`` each from t=0.1 s; a worker with ``--concurrency`` slots (threads,
the documents wait on I/O) serves them.  Three runs on the same broker: plain Celery
(arrival order), the router counting every document as 1, and the router counting each
document by its seconds (a ``priority_router_cost`` header equal to its duration).  It
reports the invoice clients' worst p95 wait, the scans' p95 wait and the makespan.

    python bench/costs.py                      # Redis
    python bench/costs.py --broker amqp://guest:guest@127.0.0.1:5672//
    python bench/costs.py --simulate --overhead 0.003   # the same documents in the simulator

``--simulate`` replays the same documents (exact lengths) in the simulator instead, FIFO and
the router's ``--mode`` by document and by seconds, with ``--overhead`` seconds a slot spends
on each document before it starts (``simulate --overhead``), so the two tables can be read
side by side; ``--scan-seconds 30 --invoice-seconds 1 --at 1`` is the issue's own trace.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from priority_router.config import RouterConfig  # noqa: E402
from priority_router.simulation import MixedSizes, compare  # noqa: E402
from workers.app import create_app  # noqa: E402
from workers.local_redis import RedisDatabases, redis_or_embedded  # noqa: E402
from workers.services import Worker  # noqa: E402
from workers.workload import p95  # noqa: E402

TASK = "workers.hold_document"
#: name -> (the router, counting by cost; the simulator's policy, what a document costs).
RUNS = {
    "plain Celery": ("off", False, "fifo", "column"),
    "router, every document 1": ("on", False, None, "column"),
    "router, cost = seconds": ("on", True, None, "duration"),
}


def run(router: str, costed: bool, args: argparse.Namespace, dbs: RedisDatabases) -> dict[str, float]:
    tag = uuid.uuid4().hex[:8]
    env = {
        "BROKER_URL": args.broker or dbs.broker,
        "RESULT_BACKEND": dbs.results,
        "DOCUMENT_QUEUE": f"bench-costs-{tag}",
        "PRIORITY_ROUTER_REDIS_URL": dbs.counter,
        "PRIORITY_ROUTER_KEY_PREFIX": f"bench-costs-{tag}:",
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
        "PRIORITY_ROUTER_MODE": args.mode,
        "WORKERS_ROUTER": router,
    }
    app = create_app(env)
    worker = Worker(env, "--pool", "threads", "--concurrency", str(args.concurrency))
    published: dict[str, tuple[str, float]] = {}
    try:
        worker.wait_ready()

        def send(client: str, n: int, seconds: float) -> None:
            headers: dict[str, object] = {"client_id": client}
            if costed:
                headers["priority_router_cost"] = seconds
            r = app.send_task(TASK, (client, f"{client}-{n}", seconds), headers=headers)
            published[r.id] = (client, time.time())

        start = time.time()
        for n in range(args.scans):
            send("scans", n, args.scan_seconds)
        time.sleep(max(0.0, start + args.at - time.time()))
        for n in range(args.invoices):
            for c in range(args.clients):
                send(f"invoices-{c}", n, args.invoice_seconds)
        results = {i: app.AsyncResult(i).get(timeout=args.timeout) for i in published}
    finally:
        worker.stop()
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(env["DOCUMENT_QUEUE"])
        app.close()
    waits: dict[str, list[float]] = {}
    for task_id, (client, at) in published.items():
        waits.setdefault(client, []).append(results[task_id]["started_at"] - at)
    invoice_p95 = [p95(w) for c, w in waits.items() if c.startswith("invoices")]
    return {
        "invoices_worst_p95": max(invoice_p95),
        "invoices_median_p95": statistics.median(invoice_p95),
        "scans_p95": p95(waits["scans"]),
        "makespan": max(r["finished_at"] for r in results.values()) - start,
    }


def simulated(args: argparse.Namespace) -> None:
    workload = MixedSizes(
        heavy=args.scans,
        heavy_seconds=args.scan_seconds,
        light_clients=args.clients,
        light_docs=args.invoices,
        light_seconds=args.invoice_seconds,
        light_at=args.at,
        jitter=0.0,
    )
    print(f"| simulated, {args.mode} | invoices: worst p95 wait | median p95 | scans: p95 wait | makespan |")
    print("|---|---|---|---|---|")
    for name, (_, _, policy, cost) in RUNS.items():
        chosen = policy or args.mode
        o = compare(
            workload.trace(), [chosen], RouterConfig(), args.concurrency, overhead=args.overhead, cost=cost
        )
        invoices = [w.p95_wait for c, w in o[chosen].per_client.items() if c.startswith("invoices")]
        print(
            f"| {name} | {max(invoices):.2f} s | {statistics.median(invoices):.2f} s | "
            f"{o[chosen].per_client['scans'].p95_wait:.2f} s | {o[chosen].makespan:.2f} s |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--broker", default=None, help="broker URL (default: the bench Redis)")
    parser.add_argument("--scans", type=int, default=20)
    parser.add_argument("--scan-seconds", type=float, default=3.0)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--invoices", type=int, default=10, help="documents per invoice client")
    parser.add_argument("--invoice-seconds", type=float, default=0.1)
    parser.add_argument("--at", type=float, default=0.1, help="seconds after the scans the invoices go out")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--mode", default="seed", choices=["seed", "inflight"])
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379", help="Redis server (db: the first of 3)")
    parser.add_argument("--simulate", action="store_true", help="the simulator instead of real workers")
    parser.add_argument("--overhead", type=float, default=0.0, help="--simulate: seconds per fetch")
    args = parser.parse_args()
    if args.simulate:
        simulated(args)
        return
    redis_url, stop_redis = redis_or_embedded(args.redis.rstrip("/"))
    dbs = RedisDatabases.from_url(args.redis).on(redis_url)
    broker = (args.broker or "redis").split(":")[0]
    try:
        print(
            f"| {broker}, {args.mode} | invoices: worst p95 wait | median p95 | scans: p95 wait | makespan |"
        )
        print("|---|---|---|---|---|")
        for name, (router, costed, _, _) in RUNS.items():
            r = run(router, costed, args, dbs)
            print(
                f"| {name} | {r['invoices_worst_p95']:.2f} s | {r['invoices_median_p95']:.2f} s | "
                f"{r['scans_p95']:.2f} s | {r['makespan']:.2f} s |",
                flush=True,
            )
    finally:
        stop_redis()


if __name__ == "__main__":
    main()
