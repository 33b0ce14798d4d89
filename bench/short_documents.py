"""Short documents: a worker draining a full queue of 20 ms documents, plain Celery against
the router, and the floor that the settings priorities need cost by themselves.

``--heavy`` documents of one client, then ``--light`` clients' one document each, are
published before a real worker starts (with ``--light-after S``: the light ones S seconds
after the worker is ready, while it drains the heavy client's); then ``celery worker -P
POOL -c N`` drains them.  Each document holds its slot ``--doc-ms`` (``time.sleep``).  The
modes run in turn, ``--repeat`` rounds, in the reverse order every other round:

- ``plain``: Celery's defaults (prefetch multiplier 4, early acks; ``workers.sleep_document``);
- ``floor``: plain Celery with the worker settings priorities need and nothing else of the
  router (``--prefetch-multiplier 1``, late acks; ``workers.hold_document``): what giving up
  prefetch costs by itself;
- ``router``: the router installed on the publisher and the worker (it sets prefetch 1, late
  acks and, on Redis, ``priority_steps`` 0..9 with ``queue_order_strategy=priority``);
- not run unless asked, to split the gap: ``floor-steps`` (``floor`` plus those two Redis
  transport options), ``prefetch1-early`` (multiplier 1, early acks), ``prefetch4-late``
  (multiplier 4, late acks), ``dp-early`` (multiplier 1, early acks and Celery's
  ``worker_disable_prefetch``, Redis only), ``floor-dp`` (with ``worker_disable_prefetch``),
  and the router with settings of the user's, in this order: ``-pN``
  (``worker_prefetch_multiplier=N``), ``-mM`` (kombu's ``max_connections=M``: with
  ``router-p1-m10``, the values a green pool on Redis must not have, which the router keeps
  as the user's own, with a warning), ``-kN`` (the router's window N documents wider,
  ``bench/short_app.py``), ``-dp`` (Celery 5.6's ``worker_disable_prefetch``), ``-eN``
  (``worker_eta_task_limit=N``), ``-cN`` (N documents of another client with a countdown of
  ``--countdown-s`` seconds, published before everything else: a worker holds them,
  unacknowledged, until they come due; they are not waited for nor counted):
  ``router-dp``, ``router-p4``, ``router-p4-dp``, ``router-c10``, ``router-e10-c10``.

``--pools`` takes ``POOL`` or ``POOL:N`` (N slots; default 4, solo 1); the worker pools'
benchmark is ``--pools gevent:20,eventlet:20,threads:8,prefork:2 --heavy 100 --doc-ms 50
--modes plain,router`` (add ``router-p1-m10`` for a green pool without its settings).

The task keeps Celery's early acks, as most projects' tasks do, except in the modes named
late, where it is ``workers.hold_document``.  ``--profile DIR`` samples each worker and its
pool's processes with py-spy (``pip install py-spy``) into ``DIR``, folded stacks; the
sampling slows the worker, so a profiled run's rates are not figures.

Reported per mode: documents/s (all documents over the worker's first start to its last
end), its ratio to ``plain`` (the median of each round's ratio, and their range), and the
light clients' p95 wait (from their publish, or the first start when published before it).
Every document must run once; a document run twice or a CRITICAL line is counted.

    python bench/short_documents.py --broker redis://127.0.0.1:6391/1 --redis redis://127.0.0.1:6391/1
    python bench/short_documents.py --broker amqp://guest:guest@127.0.0.1:5672/short --pools prefork
    python bench/short_documents.py --modes plain,floor,router,router-p2 --light-after 0.5
    python bench/short_documents.py --pools prefork --modes plain,router,router-c10,router-e10-c10
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from bench.provenance import code_version  # noqa: E402
from workers.app import create_app  # noqa: E402
from workers.local_redis import RedisDatabases, redis_or_embedded, stop_process  # noqa: E402
from workers.services import Worker  # noqa: E402
from workers.workload import p95  # noqa: E402

PRIORITY_STEPS = {"priority_steps": list(range(10)), "queue_order_strategy": "priority"}


def mode_settings(mode: str) -> tuple[bool, str, list[str], dict[str, Any], dict[str, Any]]:
    """Whether the router is on, the task, worker arguments, Celery settings and transport
    options of ``mode``."""
    if mode == "plain":
        return False, "workers.sleep_document", [], {}, {}
    if mode in ("floor", "floor-steps", "floor-dp"):
        options = PRIORITY_STEPS if mode == "floor-steps" else {}
        settings = {"worker_disable_prefetch": True} if mode == "floor-dp" else {}
        return False, "workers.hold_document", ["--prefetch-multiplier", "1"], settings, options
    if mode == "prefetch1-early":
        return False, "workers.sleep_document", ["--prefetch-multiplier", "1"], {}, {}
    if mode == "dp-early":
        settings = {"worker_disable_prefetch": True}
        return False, "workers.sleep_document", ["--prefetch-multiplier", "1"], settings, {}
    if mode == "prefetch4-late":
        return False, "workers.hold_document", [], {}, {}
    found = _ROUTER_MODE.fullmatch(mode)
    if found is None:
        raise SystemExit(f"unknown mode {mode!r}")
    prefetch, connections, extra, no_prefetch, limit, countdown = found.groups()
    settings: dict[str, Any] = {"worker_prefetch_multiplier": int(prefetch)} if prefetch else {}
    settings |= {"worker_disable_prefetch": True} if no_prefetch else {}
    settings |= {"worker_eta_task_limit": int(limit)} if limit else {}
    options: dict[str, Any] = {"max_connections": int(connections)} if connections else {}
    options |= {"WINDOW_EXTRA": extra} if extra else {}
    options |= {"COUNTDOWN": int(countdown)} if countdown else {}
    return True, "workers.sleep_document", [], settings, options


#: ``router``, with the user's ``-pN`` multiplier, ``-mM`` max_connections, ``-kN`` wider
#: window, ``-dp`` disable prefetch, ``-eN`` eta limit and ``-cN`` countdown documents.
_ROUTER_MODE = re.compile(r"router(?:-p(\d+))?(?:-m(\d+))?(?:-k(\d+))?(-dp)?(?:-e(\d+))?(?:-c(\d+))?")


#: Plain Celery's defaults where the example app differs: no events, no results kept.  A
#: document's start and end are read from the worker's log instead (its "succeeded in" line).
QUIET = {"worker_send_task_events": False, "task_send_sent_event": False, "task_ignore_result": True}
_SUCCEEDED = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}): INFO/[^\]]*\] "
    r"Task workers\.(?:sleep|hold)_document\[([0-9a-f-]+)\] succeeded in ([0-9.e-]+)s",
    re.MULTILINE,
)


def finished(log: str) -> dict[str, list[tuple[float, float]]]:
    """Each document's runs in a worker's log: task id -> [(start, end)], epoch seconds."""
    runs: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for stamp, ms, task_id, took in _SUCCEEDED.findall(log):
        end = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000
        runs[task_id].append((end - float(took), end))
    return runs


def run(mode: str, pool: str, args: argparse.Namespace, dbs: RedisDatabases) -> dict[str, float]:
    router, task, worker_args, settings, options = mode_settings(mode)
    tag = uuid.uuid4().hex[:8]
    env = {
        "BROKER_URL": args.broker or dbs.broker,
        "DOCUMENT_QUEUE": f"bench-short-{tag}",
        "PRIORITY_ROUTER_REDIS_URL": dbs.counter,
        "PRIORITY_ROUTER_KEY_PREFIX": f"bench-short-{tag}:",
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
        "WORKERS_ROUTER": "on" if router else "off",
        "CELERY_SETTINGS": json.dumps({**QUIET, **settings}),
    }
    if "WINDOW_EXTRA" in options:
        env["WINDOW_EXTRA"] = options.pop("WINDOW_EXTRA")
    countdown = options.pop("COUNTDOWN", 0)
    if options:
        env["BROKER_TRANSPORT_OPTIONS"] = json.dumps(options)
    app = create_app(env)
    app.conf.update(QUIET)
    seconds = args.doc_ms / 1000
    published: dict[str, tuple[str, float]] = {}

    def publish_light() -> None:
        for n in range(args.light):
            r = app.send_task(task, (f"light{n}", f"l{n}", seconds), headers={"client_id": f"light{n}"})
            published[r.id] = ("light", time.time())

    for n in range(countdown):
        later = ("later", f"c{n}", seconds)
        app.send_task(task, later, headers={"client_id": "later"}, countdown=args.countdown_s)
    for n in range(args.heavy):
        r = app.send_task(task, ("heavy", f"h{n}", seconds), headers={"client_id": "heavy"})
        published[r.id] = ("heavy", time.time())
    if args.light_after is None:
        publish_light()
    pool, _, count = pool.partition(":")
    count = count or str(args.concurrency or (1 if pool == "solo" else 4))
    worker = Worker(env, "--pool", pool, "--concurrency", count, *worker_args, app="bench.short_app")
    profiler = None
    try:
        worker.wait_ready()
        if args.profile:
            # CPU samples of the worker and its pool's processes, folded stacks, one file a run.
            out = Path(args.profile) / f"{pool}-{mode}-{tag}.txt"
            command = [args.py_spy, "record", "--pid", str(worker.process.pid), "--subprocesses"]
            command += ["--rate", "250", "--format", "raw", "--output", str(out), "--nonblocking"]
            profiler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if args.light_after is not None:
            time.sleep(args.light_after)
            publish_light()
        deadline = time.monotonic() + args.timeout
        while len(finished(worker.output())) < len(published):
            if time.monotonic() > deadline or worker.process.poll() is not None:
                raise RuntimeError(f"{mode}: not every document ran:\n{worker.output()[-3000:]}")
            time.sleep(0.2)
        time.sleep(0.5)  # a document delivered again would run by now
        stop_process(worker.process, timeout=30)
        log = worker.output()
    finally:
        worker.stop()
        if profiler is not None:
            profiler.wait(timeout=30)
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(env["DOCUMENT_QUEUE"])
        app.close()
    runs = finished(log)
    first = min(start for task_id in published for start, _ in runs[task_id])
    done = max(end for task_id in published for _, end in runs[task_id])
    light = [runs[t][0][0] - max(at, first) for t, (group, at) in published.items() if group == "light"]
    got = {
        "docs_s": len(published) / (done - first),
        "drain": done - first,
        "light_p95": p95(light),
        "twice": sum(1 for t in published if len(runs[t]) > 1),
        "critical": log.count("CRITICAL"),
    }
    if args.verbose:
        print(
            f"  {pool} {mode}: {got['docs_s']:.1f} documents/s, light p95 {got['light_p95'] * 1000:.0f} ms",
            file=sys.stderr,
            flush=True,
        )
    return got


def report(pool: str, modes: list[str], got: dict[str, list[dict[str, float]]]) -> None:
    plain = got["plain"]
    for mode in modes:
        rows = got[mode]
        ratios = [r["docs_s"] / (p["docs_s"] or float("nan")) for r, p in zip(rows, plain, strict=True)]
        cells = [
            pool,
            mode,
            f"{statistics.median(r['docs_s'] for r in rows):.0f}",
            f"{statistics.median(r['drain'] for r in rows):.2f} s",
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})",
            f"{statistics.median(r['light_p95'] for r in rows) * 1000:.0f} ms",
            "/".join(f"{int(r['twice'])}+{int(r['critical'])}" for r in rows),
        ]
        print("| " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pools", default="prefork,threads,solo")
    parser.add_argument(
        "--concurrency", type=int, default=None, help="slots of a POOL without :N (4, solo 1)"
    )
    parser.add_argument("--modes", default="plain,floor,router")
    parser.add_argument("--broker", default=None, help="broker URL (default: the bench Redis)")
    parser.add_argument("--heavy", type=int, default=400)
    parser.add_argument("--light", type=int, default=10)
    parser.add_argument("--light-after", type=float, default=None)
    parser.add_argument("--doc-ms", type=float, default=20)
    parser.add_argument("--countdown-s", type=float, default=300, help="the -cN modes' countdown")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--profile", default=None, help="a directory: py-spy samples each worker into it")
    parser.add_argument("--verbose", action="store_true", help="each run's figures, on stderr")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379", help="Redis server (db: the first of 3)")
    args = parser.parse_args()
    modes = args.modes.split(",")
    args.py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    if "plain" not in modes:
        raise SystemExit("--modes needs plain: every ratio is to it")
    redis_url, stop_redis = redis_or_embedded(args.redis.rstrip("/"))
    dbs = RedisDatabases.from_url(args.redis).on(redis_url)
    try:
        print(f"code {code_version()}; broker {args.broker or dbs.broker}; {args.doc_ms:g} ms documents")
        print("| pool | mode | documents/s | drain | vs plain (range) | light p95 | run twice + CRITICAL |")
        print("|---|---|---|---|---|---|---|")
        for pool in args.pools.split(","):
            got: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
            for round_ in range(args.repeat):
                for mode in modes if round_ % 2 == 0 else modes[::-1]:
                    try:
                        got[mode].append(run(mode, pool, args, dbs))
                    except Exception as exc:  # a collapsed run is a result too
                        print(f"  {pool} {mode}: {type(exc).__name__}: {exc}", file=sys.stderr)
                        got[mode].append(
                            {
                                "docs_s": 0.0,
                                "drain": 0.0,
                                "light_p95": float("inf"),
                                "twice": -1,
                                "critical": -1,
                            }
                        )
            report(pool, modes, got)
    finally:
        stop_redis()


if __name__ == "__main__":
    main()
