"""Light clients through a counter-store outage during a giant's burst: the publisher's own
counts (``reason="local"``) against the default priority (the release before), in the same run.

One real worker (``--pool``, ``--concurrency``; documents hold a slot ``--doc-ms``) serves
one publisher.  The giant publishes ``--giant`` documents evenly over ``--giant-spread``
seconds; ``--outage-at`` seconds in, the counter store (a redis-server of the benchmark's
own) stops answering for ``--outage`` seconds (``--fault``: ``sigstop``, ``pause`` for
``CLIENT PAUSE``, ``restart``: stopped with SIGTERM and started again, empty); ``--light-clients``
clients publish ``--light-docs`` each, evenly over the outage.  A wait is the worker's
``started_at`` minus the publisher's clock when ``send_task`` returned.

Each round runs both configurations, alternating which goes first: ``today`` (the
publisher's router gives every publish ``default_priority`` while the store fails, as the
release before did: its engine's local pricing switched off in this process) and
``local``.  Per round: light p95 and longest wait, giant p95, makespan; then the medians
over the rounds and light p95's ratio, local / today.

``--publish-cost`` answers the other question, with no worker: what one ``send_task``,
and the router's decision alone, cost with the router's local counts and without them,
the store answering and then stopped (SIGSTOP), in interleaved blocks of ``--block``.

    python bench/store_outage.py --rounds 3                 # about 40 s a round
    python bench/store_outage.py --rounds 3 --fault restart
    python bench/store_outage.py --publish-cost
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from priority_router.decision import Decision  # noqa: E402
from priority_router.engine import Engine  # noqa: E402
from priority_router.integration.installation import installed_engine  # noqa: E402
from priority_router.simulation import p95  # noqa: E402
from workers.app import create_app  # noqa: E402
from workers.local_redis import EmbeddedRedis, RedisDatabases, redis_or_embedded, start_embedded_redis  # noqa: E402
from workers.services import running_worker  # noqa: E402
from workers.workload import HOLD  # noqa: E402

CONFIGS = ("today", "local")


class Store:
    """The counter store, a redis-server of the benchmark's own, and its faults."""

    def __init__(self) -> None:
        self.server: EmbeddedRedis = start_embedded_redis()

    @property
    def url(self) -> str:
        return self.server.url + "/0"

    def stop(self, fault: str, seconds: float) -> None:
        if fault == "sigstop":
            os.kill(self.server.process.pid, signal.SIGSTOP)
        elif fault == "pause":
            control = redis.Redis.from_url(self.url)
            control.execute_command("CLIENT", "PAUSE", int(seconds * 1000), "ALL")
            control.close()
        else:
            self.server.stop()

    def resume(self, fault: str) -> None:
        if fault == "sigstop":
            os.kill(self.server.process.pid, signal.SIGCONT)
        elif fault == "restart":
            self.server = start_embedded_redis(self.server.port)

    def close(self) -> None:
        os.kill(self.server.process.pid, signal.SIGCONT)
        self.server.stop()


def as_today(engine: Engine) -> None:
    """This process's engine as the release before: no local counts, the default priority
    for every publish the store does not count."""

    def fail_open(client_id: str, units: int, n: int = 1) -> list[Decision]:
        return [engine.fail_open(client_id)] * n

    engine.counted_here = fail_open  # type: ignore[method-assign]
    engine.local.counted = lambda *_: None  # type: ignore[method-assign]


def publisher(config: str, env: dict[str, str]) -> Any:
    app = create_app(env)
    if config == "today":
        as_today(installed_engine(app))
    return app


def timeline(args: argparse.Namespace) -> list[tuple[float, str, str]]:
    """(seconds from the start, client, document id), in publish order."""
    docs = [(args.giant_spread * n / args.giant, "giant", f"g{n}") for n in range(args.giant)]
    light = args.light_clients * args.light_docs
    for n in range(light):
        at = args.outage_at + args.outage * (n + 0.5) / light
        docs.append((at, f"light{n % args.light_clients}", f"l{n}"))
    return sorted(docs)


def measure(
    config: str, store: Store, databases: RedisDatabases, args: argparse.Namespace
) -> dict[str, float]:
    env = {
        "BROKER_URL": databases.broker,
        "RESULT_BACKEND": databases.results,
        "DOCUMENT_QUEUE": f"bench-outage-{uuid.uuid4().hex[:6]}",
        "PRIORITY_ROUTER_REDIS_URL": store.url,
        "PRIORITY_ROUTER_KEY_PREFIX": f"bench-outage-{uuid.uuid4().hex[:6]}:",
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
        "PRIORITY_ROUTER_MODE": args.mode,
    }
    app = publisher(config, env)
    seconds = args.doc_ms / 1000
    sent: dict[str, tuple[str, float]] = {}
    worker_args = ("--pool", args.pool, "--concurrency", str(args.concurrency))
    with running_worker(env, *worker_args):
        app.send_task(HOLD, ("warm", "w", 0), headers={"client_id": "warm"}).get(timeout=60)
        start = time.time()
        stop = threading.Timer(args.outage_at, store.stop, (args.fault, args.outage))
        resume = threading.Timer(args.outage_at + args.outage, store.resume, (args.fault,))
        stop.start()
        resume.start()
        for at, client, doc in timeline(args):
            delay = start + at - time.time()
            if delay > 0:
                time.sleep(delay)
            result = app.send_task(HOLD, (client, doc, seconds), headers={"client_id": client})
            sent[result.id] = (client, time.time())
        resume.join()
        reports = {tid: app.AsyncResult(tid).get(timeout=600) for tid in sent}
    app.close()
    waits: dict[str, list[float]] = {"light": [], "giant": []}
    for tid, (client, at) in sent.items():
        waits["giant" if client == "giant" else "light"].append(reports[tid]["started_at"] - at)
    return {
        "light p95": p95(waits["light"]),
        "light max": max(waits["light"]),
        "giant p95": p95(waits["giant"]),
        "makespan": max(r["finished_at"] for r in reports.values()) - start,
    }


def outage(args: argparse.Namespace, databases: RedisDatabases) -> None:
    store = Store()
    runs: dict[str, list[dict[str, float]]] = {config: [] for config in CONFIGS}
    try:
        for n in range(args.rounds):
            order = CONFIGS if n % 2 == 0 else CONFIGS[::-1]
            for config in order:
                figures = measure(config, store, databases, args)
                runs[config].append(figures)
                shown = ", ".join(f"{name} {value:.2f} s" for name, value in figures.items())
                print(f"round {n + 1} {config}: {shown}", flush=True)
    finally:
        store.close()
    medians = {
        config: {m: statistics.median(r[m] for r in runs[config]) for m in runs[config][0]}
        for config in CONFIGS
    }
    for config in CONFIGS:
        print(f"median {config}: " + ", ".join(f"{m} {v:.2f} s" for m, v in medians[config].items()))
    per_round = [
        local["light p95"] / today["light p95"]
        for today, local in zip(runs["today"], runs["local"], strict=True)
    ]
    print(
        f"light p95, local / today: {medians['local']['light p95'] / medians['today']['light p95']:.3f} "
        f"(per round {', '.join(f'{r:.3f}' for r in per_round)})"
    )


def publish_cost(args: argparse.Namespace, databases: RedisDatabases) -> None:
    store = Store()
    env = {
        "BROKER_URL": databases.broker,
        "DOCUMENT_QUEUE": f"bench-outage-cost-{uuid.uuid4().hex[:6]}",
        "PRIORITY_ROUTER_REDIS_URL": store.url,
        "PRIORITY_ROUTER_KEY_PREFIX": f"bench-outage-{uuid.uuid4().hex[:6]}:",
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
    }
    apps = {config: publisher(config, env) for config in CONFIGS}

    def publishes(app: Any) -> float:
        started = time.perf_counter()
        for n in range(args.block):
            client = f"c{n % 200}"
            app.send_task(HOLD, (client, "d", 0), headers={"client_id": client})
        return (time.perf_counter() - started) / args.block

    def decisions(app: Any) -> float:
        engine = installed_engine(app)
        started = time.perf_counter()
        for n in range(args.block):
            engine.decide(f"c{n % 200}")
        return (time.perf_counter() - started) / args.block

    def rounds(state: str) -> None:
        for what, block in (("a publish", publishes), ("a decision alone", decisions)):
            for app in apps.values():
                block(app)  # connections open, counts warm
            seconds: dict[str, list[float]] = {config: [] for config in CONFIGS}
            for n in range(args.rounds * 5):
                for config in CONFIGS if n % 2 == 0 else CONFIGS[::-1]:
                    seconds[config].append(block(apps[config]))
            today, local = (statistics.median(seconds[c]) for c in CONFIGS)
            ratios = sorted(loc / tod for tod, loc in zip(seconds["today"], seconds["local"], strict=True))
            print(
                f"store {state}: {what} {today * 1e6:.1f} µs today, {local * 1e6:.1f} µs with local "
                f"counts: ratio of medians {local / today:.3f}, median of the {len(ratios)} paired "
                f"blocks' ratios {statistics.median(ratios):.3f} ({ratios[0]:.2f}-{ratios[-1]:.2f})",
                flush=True,
            )

    try:
        rounds("answering")
        store.stop("sigstop", 0)
        rounds("stopped (SIGSTOP)")
    finally:
        for app in apps.values():
            with app.connection_for_write() as conn:
                conn.default_channel.queue_delete(env["DOCUMENT_QUEUE"])
            app.close()
        store.close()


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--redis",
        default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"),
        help="the broker's and results' Redis (its databases as the tests use them)",
    )
    parser.add_argument("--fault", choices=("sigstop", "pause", "restart"), default="sigstop")
    parser.add_argument("--outage", type=float, default=3.0, help="seconds the store does not answer")
    parser.add_argument("--outage-at", type=float, default=0.5, help="seconds from the first publish")
    parser.add_argument("--giant", type=int, default=300, help="the giant's documents")
    parser.add_argument("--giant-spread", type=float, default=2.0, help="seconds the giant's burst spans")
    parser.add_argument("--light-clients", type=int, default=10)
    parser.add_argument("--light-docs", type=int, default=3, help="documents per light client")
    parser.add_argument("--doc-ms", type=float, default=50, help="how long each document holds a slot")
    parser.add_argument("--mode", choices=("seed", "inflight"), default="seed", help="the counting mode")
    parser.add_argument("--pool", default="threads")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--publish-cost", action="store_true", help="time a publish instead (no worker)")
    parser.add_argument("--block", type=int, default=500, help="--publish-cost: publishes per block")
    return parser


def main() -> None:
    args = arguments().parse_args()
    url, stop_redis = redis_or_embedded(args.redis.rstrip("/"))
    try:
        databases = RedisDatabases.from_url(url)
        (publish_cost if args.publish_cost else outage)(args, databases)
    finally:
        stop_redis()


if __name__ == "__main__":
    main()
