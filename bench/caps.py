"""Per-client caps and rates (docs/caps.md) with a real worker, on Redis and RabbitMQ.

Every scenario runs twice in the same invocation, on the same broker, with the same seeded
document lengths: once with the router and no limits (the baseline), once with the limits.
A worker with ``--concurrency`` slots (4, ``-P threads`` by default) runs
``workers.hold_document``, which holds its slot for the document's seconds; each run has a
queue and a key prefix of its own and deletes them (and its results) afterwards.

1. **cap**: one client, ``heavy``, publishes ``--heavy`` documents of 1.5-3 s, all at t=0
   (a bulk dump); from ``--light-start`` s, 8 light clients send ``--light-docs``
   documents of ``--light-seconds`` (0.05-0.15 s) between them, one every
   ``--light-every`` s (round robin over the clients).  This is the slow-neighbour trace
   (12 documents of 50-70 s beside 40 of 1-3 s) scaled so the heavy documents take
   1.5-3 s: light documents need a third of one slot, which a cap of 3 of 4 leaves them.  Uncapped vs
   ``set_tier("heavy", max_in_flight=3)``.  Reported: the light documents' wait (publish to
   start) p50/p95/max; the most heavy documents running at once, from the tasks' own start
   and end times (``run``) and from sampling ``router.gate_state("heavy").running`` every
   50 ms (``gate``: it also counts a released document on its way back through the broker);
   the heavy client's makespan (its first publish to its last end).
2. **borrow**: the heavy client's documents alone, uncapped vs
   ``max_in_flight=3, borrow=True``: its makespan and the most running at once.
3. **rate**: ``--rate-docs`` documents of 0 s at t=0, uncapped vs ``rate="5/s"``: how many
   started within ``--rate-window`` s of the first start (a bucket of 5, then 5 a second:
   about 5 + 5 x 20 = 105).

    python bench/caps.py --broker both          # Redis, then RabbitMQ
    python bench/caps.py --broker amqp --json

RabbitMQ runs in a vhost of its own (``--amqp``, default vhost ``bench-caps``):
``rabbitmqctl add_vhost bench-caps; rabbitmqctl set_permissions -p bench-caps guest ".*" ".*" ".*"``.
Redis databases: ``--redis`` names the first of three (counters, broker, results; 10-12).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import redis  # noqa: E402

from priority_router import PriorityRouter  # noqa: E402
from priority_router.router import engine_of  # noqa: E402
from workers.app import create_app  # noqa: E402
from workers.local_redis import RedisDatabases  # noqa: E402
from workers.services import Worker  # noqa: E402
from workers.workload import HOLD, most_at_once, p95  # noqa: E402

HEAVY = "heavy"
#: Seconds between two looks at the heavy client's gate.
SAMPLE_EVERY = 0.05


@dataclass(frozen=True)
class Doc:
    at: float  #: seconds after the run's first publish
    client: str
    seconds: float


@dataclass
class Run:
    """What one run measured."""

    scenario: str
    limits: str
    published: dict[str, tuple[Doc, float]] = field(default_factory=dict)  # id -> (doc, publish clock)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> the task's report
    start: float = 0.0
    gate_running_max: int = 0
    gate_held_max: int = 0
    concurrency: int = 4
    log: str = ""


def cap_workload(args: argparse.Namespace, light_docs: int = 0, every: float = 0.0) -> list[Doc]:
    """The heavy dump and ``light_docs`` light documents one every ``every`` s, seeded."""
    rng = random.Random(args.seed)
    docs = [Doc(0.0, HEAVY, round(rng.uniform(1.5, 3.0), 3)) for _ in range(args.heavy)]
    low, high = args.light_seconds
    for i in range(light_docs):
        client = f"light-{i % args.light_clients}"
        docs.append(Doc(args.light_start + i * every, client, round(rng.uniform(low, high), 3)))
    return sorted(docs, key=lambda d: d.at)


def rate_workload(args: argparse.Namespace) -> list[Doc]:
    return [Doc(0.0, "api", 0.0) for _ in range(args.rate_docs)]


def environment(tag: str, broker: str, dbs: RedisDatabases, args: argparse.Namespace) -> dict[str, str]:
    return {
        "BROKER_URL": broker,
        "RESULT_BACKEND": dbs.results,
        "DOCUMENT_QUEUE": f"bench-caps-{tag}",
        "PRIORITY_ROUTER_REDIS_URL": dbs.counter,
        "PRIORITY_ROUTER_KEY_PREFIX": f"bench-caps-{tag}:",
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
        "WORKERS_ROUTER": "on",
    }


def measure(
    scenario: str,
    docs: list[Doc],
    limits: dict[str, dict[str, Any]],
    broker: str,
    dbs: RedisDatabases,
    args: argparse.Namespace,
    window: float | None = None,
) -> Run:
    """Publish ``docs`` to a fresh worker with ``limits`` (client -> set_tier keywords) set
    before it starts; collect every report, or, with ``window``, the reports of the
    documents that ended within ``window`` s of the first start (the rest are dropped)."""
    tag = uuid.uuid4().hex[:8]
    env = environment(tag, broker, dbs, args)
    run = Run(scenario, "; ".join(f"{c}: {kw}" for c, kw in limits.items()) or "none")
    run.concurrency = args.concurrency
    router = PriorityRouter.from_env(env, socket_timeout=5, connect_timeout=5)
    for client, keywords in limits.items():
        router.set_tier(client, **keywords)
    app = create_app(env)
    pool_args = ["--pool", args.pool, "--concurrency", str(args.concurrency), "--loglevel", args.loglevel]
    worker = Worker(env, *pool_args)
    stop_sampling = threading.Event()

    def sample() -> None:
        while not stop_sampling.wait(SAMPLE_EVERY):
            state = router.gate_state(HEAVY)
            run.gate_running_max = max(run.gate_running_max, state.running)
            run.gate_held_max = max(run.gate_held_max, state.held)

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        worker.wait_ready()
        sampler.start()
        run.start = time.time()
        for doc in docs:
            delay = run.start + doc.at - time.time()
            if delay > 0:
                time.sleep(delay)
            r = app.send_task(
                HOLD,
                (doc.client, f"{doc.client}-{len(run.published)}", doc.seconds),
                headers={"client_id": doc.client},
            )
            run.published[r.id] = (doc, time.time())
        if window is None:
            run.results = {i: app.AsyncResult(i).get(timeout=args.timeout) for i in run.published}
        else:
            first = app.AsyncResult(next(iter(run.published))).get(timeout=args.timeout)
            time.sleep(max(0.0, first["started_at"] + window + 1.0 - time.time()))
            for i in run.published:
                result = app.AsyncResult(i)
                if result.ready():
                    run.results[i] = result.get(timeout=5)
    finally:
        stop_sampling.set()
        if sampler.is_alive():
            sampler.join(5)
        run.log = worker.output()
        worker.stop()
        cleanup(app, env, dbs, list(run.published))
        app.close()
        engine_of(router).redis.close()
    return run


def cleanup(app: Any, env: dict[str, str], dbs: RedisDatabases, task_ids: list[str]) -> None:
    """Delete the run's queue, its results and every key under its prefix."""
    queue = env["DOCUMENT_QUEUE"]
    with app.connection_for_write() as conn:
        try:
            conn.default_channel.queue_delete(queue)
        except Exception as exc:  # a queue the broker never declared
            print(f"# could not delete queue {queue}: {exc}", file=sys.stderr)
    counter = redis.Redis.from_url(dbs.counter)
    keys = list(counter.scan_iter(match=env["PRIORITY_ROUTER_KEY_PREFIX"] + "*", count=1000))
    if keys:
        counter.delete(*keys)
    counter.close()
    results = redis.Redis.from_url(dbs.results)
    for start in range(0, len(task_ids), 500):
        results.delete(*(f"celery-task-meta-{i}" for i in task_ids[start : start + 500]))
    results.close()
    if env["BROKER_URL"].startswith("redis"):
        broker = redis.Redis.from_url(dbs.broker)
        for key in broker.scan_iter(match=f"*{queue}*", count=1000):
            broker.delete(key)
        for key in broker.scan_iter(match="_kombu.binding.*", count=1000):
            for member in broker.smembers(key):
                if queue.encode() in member:
                    broker.srem(key, member)
        broker.close()


def reports_of(run: Run, light: bool) -> list[tuple[Doc, float, dict[str, Any]]]:
    return [
        (doc, at, run.results[i])
        for i, (doc, at) in run.published.items()
        if i in run.results and (doc.client != HEAVY) == light
    ]


def cap_figures(run: Run) -> dict[str, Any]:
    heavy = reports_of(run, light=False)
    light = reports_of(run, light=True)
    heavy_start = min(at for _, at, _ in heavy)
    figures: dict[str, Any] = {
        "scenario": run.scenario,
        "limits": run.limits,
        "documents": len(run.results),
        "heavy_makespan": max(r["finished_at"] for _, _, r in heavy) - heavy_start,
        "heavy_most_running": most_at_once((r["started_at"], r["finished_at"]) for _, _, r in heavy),
        "heavy_gate_running_max": run.gate_running_max,
        "heavy_gate_held_max": run.gate_held_max,
        # Slot-seconds the heavy client left idle while it had work: what borrowing loses.
        "heavy_idle_slot_seconds": run.concurrency
        * (max(r["finished_at"] for _, _, r in heavy) - heavy_start)
        - sum(d.seconds for d, _, _ in heavy),
        "makespan": max(r["finished_at"] for r in run.results.values()) - run.start,
    }
    if light:
        waits = sorted(r["started_at"] - at for _, at, r in light)
        # A light document published while another light one runs finds, under a cap of
        # concurrency - 1, every slot busy: it waits for the first end, capped or not.
        behind = [
            (
                r["started_at"] - at,
                any(o["started_at"] <= at < o["finished_at"] for _, _, o in light if o is not r),
            )
            for _, at, r in light
        ]
        alone = [w for w, other in behind if not other]
        figures.update(
            light_docs=len(waits),
            light_p50=statistics.median(waits),
            light_p95=p95(waits),
            light_max=waits[-1],
            light_waits=[round(w, 3) for w in waits],
            light_after_light=sum(1 for _, other in behind if other),
            light_alone_p95=p95(alone) if alone else None,
            light_alone_max=max(alone) if alone else None,
        )
    return figures


def simulated(docs: list[Doc], limits: dict[str, dict[str, Any]], concurrency: int) -> dict[str, float]:
    """``priority-router simulate`` on the same documents and limits: light p95, heavy makespan."""
    import csv
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False, newline="") as trace:
        writer = csv.writer(trace)
        writer.writerow(["timestamp", "client_id", "duration"])
        writer.writerows((d.at, d.client, d.seconds) for d in docs)
    command = [sys.executable, "-m", "priority_router", "simulate", trace.name, "--workers", str(concurrency)]
    command += ["--policies", "seed", "--json"]
    for client, words in limits.items():
        spec = ",".join(k if v is True else f"{k}={v}" for k, v in words.items())
        command += ["--tier", f"{client}={spec}"]
    try:
        report = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    finally:
        Path(trace.name).unlink()
    schedule = report["seed"]
    light = [c for c in schedule["per_client"] if c != HEAVY]
    waits = [schedule["per_client"][c]["p95_wait"] for c in light]
    return {
        "light_p95": max(waits) if waits else 0.0,
        "makespan": schedule["makespan"],
    }


def rate_figures(run: Run, window: float) -> dict[str, Any]:
    starts = sorted(r["started_at"] for r in run.results.values())
    first = starts[0]
    return {
        "scenario": run.scenario,
        "limits": run.limits,
        "published": len(run.published),
        "started_in_window": sum(1 for s in starts if s - first <= window),
        "started_in_first_second": sum(1 for s in starts if s - first < 1.0),
        "window": window,
    }


def bench_broker(name: str, broker: str, dbs: RedisDatabases, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"broker": name, "pool": args.pool, "concurrency": args.concurrency}
    runs: list[Run] = []

    def keep(run: Run) -> Run:
        runs.append(run)
        if args.logs:
            path = Path(args.logs) / f"{name}-{run.scenario}-{len(runs)}.log"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(run.log)
        return run

    capped = {HEAVY: {"max_in_flight": args.cap}}
    for scenario, light_docs, every in (
        ("cap", args.light_docs, args.light_every),
        ("cap-sparse", args.sparse_docs, args.sparse_every),
    ):
        if scenario in args.scenarios:
            docs = cap_workload(args, light_docs, every)
            out[scenario] = [
                cap_figures(keep(measure(scenario, docs, {}, broker, dbs, args))),
                cap_figures(keep(measure(scenario, docs, capped, broker, dbs, args))),
            ]
            out[f"{scenario}-simulated"] = [
                simulated(docs, {}, args.concurrency),
                simulated(docs, capped, args.concurrency),
            ]
    if "borrow" in args.scenarios:
        docs = cap_workload(args)
        borrowing = {HEAVY: {"max_in_flight": args.cap, "borrow": True}}
        out["borrow"] = [
            cap_figures(keep(measure("borrow", docs, {}, broker, dbs, args))),
            cap_figures(keep(measure("borrow", docs, borrowing, broker, dbs, args))),
        ]
    if "rate" in args.scenarios:
        docs = rate_workload(args)
        w = args.rate_window
        rated = {"api": {"rate": args.rate}}
        out["rate"] = [
            rate_figures(keep(measure("rate", docs, {}, broker, dbs, args, window=w)), w),
            rate_figures(keep(measure("rate", docs, rated, broker, dbs, args, window=w)), w),
        ]
    return out


def ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")


def print_tables(result: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"\n## {result['broker']}: -P {result['pool']} -c {result['concurrency']}; heavy: {args.heavy} "
        f"docs of 1.5-3 s at t=0; light docs of {args.light_seconds[0]:g}-{args.light_seconds[1]:g} s "
        f"from t={args.light_start:g} s, round robin over {args.light_clients} clients; seed {args.seed}"
    )
    shapes = {
        "cap": f"{args.light_docs} light docs, one every {args.light_every:g} s",
        "cap-sparse": f"{args.sparse_docs} light docs, one every {args.sparse_every:g} s",
    }
    for scenario, shape in shapes.items():
        if scenario not in result:
            continue
        base, capped = result[scenario]
        print(
            f"\n| {scenario}: {shape} | light p50 | light p95 | light max | light docs behind a light "
            "| heavy most running (run / gate) | heavy makespan |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in (base, capped):
            print(
                f"| {r['limits']} | {r['light_p50']:.2f} s | {r['light_p95']:.2f} s | {r['light_max']:.2f} s "
                f"| {r['light_after_light']}/{r['light_docs']} | {r['heavy_most_running']} / "
                f"{r['heavy_gate_running_max']} | {r['heavy_makespan']:.2f} s |"
            )
        p95_ratio = ratio(capped["light_p95"], base["light_p95"])
        span_ratio = ratio(capped["heavy_makespan"], base["heavy_makespan"])
        print(
            f"capped/uncapped: light p95 {p95_ratio:.2f} (target <= 0.20), heavy makespan "
            f"{span_ratio:.2f} (target <= 1.40); heavy most running {capped['heavy_most_running']} "
            f"(target <= {args.cap})"
        )
        if capped["light_alone_max"] is not None:
            print(
                f"capped, light docs published while no other light doc ran: "
                f"p95 {capped['light_alone_p95']:.2f} s, max {capped['light_alone_max']:.2f} s"
            )
        sim = result.get(f"{scenario}-simulated")
        if sim:
            for label, real, model in (("uncapped", base, sim[0]), ("capped", capped, sim[1])):
                print(
                    f"simulate, {label}: light p95 {model['light_p95']:.2f} s "
                    f"(real {real['light_p95']:.2f} s), "
                    f"makespan {model['makespan']:.2f} s (real {real['makespan']:.2f} s, "
                    f"{ratio(real['makespan'], model['makespan']):.2f}x)"
                )
        print(f"light waits (s), uncapped: {base['light_waits']}")
        print(f"light waits (s), capped:   {capped['light_waits']}")
    if "borrow" in result:
        base, borrowed = result["borrow"]
        print(
            "\n| borrow, heavy alone | makespan | most running (run / gate) | held at most "
            "| idle slot-seconds |"
        )
        print("|---|---|---|---|---|")
        for r in (base, borrowed):
            print(
                f"| {r['limits']} | {r['heavy_makespan']:.2f} s | {r['heavy_most_running']} / "
                f"{r['heavy_gate_running_max']} | {r['heavy_gate_held_max']} "
                f"| {r['heavy_idle_slot_seconds']:.2f} |"
            )
        span_ratio = ratio(borrowed["heavy_makespan"], base["heavy_makespan"])
        print(
            f"borrow/uncapped makespan {span_ratio:.3f} (target <= 1.05), most running "
            f"{borrowed['heavy_most_running']} (target {args.concurrency})"
        )
    if "rate" in result:
        print(
            f"\n| rate, {args.rate_docs} docs of 0 s at t=0 | started within {args.rate_window:g} s "
            "| in the first second |"
        )
        print("|---|---|---|")
        for r in result["rate"]:
            print(f"| {r['limits']} | {r['started_in_window']} | {r['started_in_first_second']} |")
        print(f"rate: {result['rate'][1]['started_in_window']} started (target 100 +- 10, about 105)")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--broker", choices=["redis", "amqp", "both"], default="both")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/10", help="first of 3 Redis dbs")
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/bench-caps")
    parser.add_argument(
        "--scenarios",
        default="cap,cap-sparse,borrow,rate",
        help="comma list of cap, cap-sparse, borrow, rate",
    )
    parser.add_argument("--pool", default="threads")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--loglevel", default="INFO")
    parser.add_argument("--logs", help="write each run's worker log into this directory")
    parser.add_argument("--heavy", type=int, default=24)
    parser.add_argument("--cap", type=int, default=3, help="the heavy client's max_in_flight")
    parser.add_argument("--light-clients", type=int, default=8)
    parser.add_argument("--light-docs", type=int, default=40, help="light documents in all")
    parser.add_argument("--light-every", type=float, default=0.25, help="seconds between light documents")
    parser.add_argument(
        "--light-seconds",
        type=lambda text: tuple(float(x) for x in text.split("-", 1)),
        default=(0.05, 0.15),
        help="a light document's seconds, MIN-MAX",
    )
    parser.add_argument("--light-start", type=float, default=0.5)
    parser.add_argument("--sparse-docs", type=int, default=6, help="light documents of cap-sparse")
    parser.add_argument("--sparse-every", type=float, default=3.0, help="cap-sparse: seconds between them")
    parser.add_argument("--rate", default="5/s")
    parser.add_argument("--rate-docs", type=int, default=200)
    parser.add_argument("--rate-window", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--json", action="store_true", help="print only a JSON document")
    args = parser.parse_args()
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    dbs = RedisDatabases.from_url(args.redis)
    brokers = {"redis": dbs.broker, "amqp": args.amqp}
    names = ["redis", "amqp"] if args.broker == "both" else [args.broker]
    results = []
    for name in names:
        result = bench_broker(name, brokers[name], dbs, args)
        results.append(result)
        if not args.json:
            print_tables(result, args)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
