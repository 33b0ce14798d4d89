"""What the router adds to each ``apply_async``, in Redis round trips.

Each publisher process holds two apps on the same Redis broker and queue: a plain one and
one with the router installed.  It times blocks of publishes, alternating plain, routed
and ``PING`` blocks, so all three see the same machine at the same moment; the added
time of each block pair is divided by the ``PING`` block beside it.  While a plain block
runs, the router's ``before_task_publish`` receiver is disconnected, so plain blocks run
exactly as in a process without the router (a connected receiver slows every publish of
the process, routed or not).  Fresh processes are started ``--processes`` times, since
connection placement and caches differ between processes.

A redis-py ``PING`` is one round trip with redis-py's own per-command overhead, the unit
issue #12 states its target in.  A ``PING`` timed in a tight loop is the cheapest round
trip there is: the Redis server never goes idle.  Made once per publish, between
Celery's own work, the same ``PING`` costs more (the server has gone idle and must be
woken, and the hook itself is a signal dispatch).  So a fourth kind of block, ``floor``,
publishes plainly with a receiver that only sends one ``PING``: the least any
synchronous design that asks Redis once per publish can add.

    python bench/publish_overhead.py [--processes 3] [--blocks 30] [--block 100] [--modes seed[,inflight]]

With ``--modes seed,inflight`` the blocks of both modes alternate in each process, and the
``vs seed`` column divides what the inflight mode adds by what the seed mode adds in the
block beside it: the comparison issue #13 asks for ("publishing must cost no more than
in the seed mode").  ``--modes seed,seed:tiers`` measures what reading the client's tier
in the check costs once a deployment has tiers (until then the check leaves it out).
``--modes seed,seed:costs,seed:costed`` measures documents of cost 1 once a deployment
counts costs (the check then reads the client's extras), and documents that each carry a
``priority_router_cost`` header (the check adds to the extras).  ``--modes seed,seed:capped``
measures publishes of clients that each have a cap and a rate (publishers never read limits:
the workers' gate does).  ``--modes seed,seed:unwatched`` measures what the publisher's
look at its priority lists (``integration/stranded.py``) costs a publish: the second mode
runs without it.

``--cluster N`` puts the router's counter on a local Redis Cluster of ``N`` masters without
replicas (the broker stays on the one Redis), and the ``PING`` blocks and the floor's
``PING`` go to the master that serves each document's client, as its check does: the
floor is then one round trip to the same master.

    python bench/publish_overhead.py --cluster 3 [--processes 3] [--blocks 30] [--block 100]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: A mode's name with this suffix runs it where a tier is stored, so its check reads the tier.
TIERED = ":tiers"
#: ... where costs are in use, so its check reads the client's extras (cost-1 documents).
COSTS = ":costs"
#: ... publishing documents that each cost 2.5.
COSTED = ":costed"
#: ... where every client publishing has a cap and a rate, and the default tier too.
CAPPED = ":capped"
#: ... with the publisher's look at its Redis priority lists switched off (stranded.py).
UNWATCHED = ":unwatched"
SUFFIXES = (TIERED, COSTS, COSTED, CAPPED, UNWATCHED)


def base_mode(mode: str) -> str:
    for suffix in SUFFIXES:
        mode = mode.removesuffix(suffix)
    return mode


sys.path[:0] = [str(ROOT)]


def child(
    redis_url: str, blocks: int, block: int, modes: list[str], store: str | None = None
) -> dict[str, Any]:
    import redis
    from celery import Celery
    from celery.signals import before_task_publish

    from bench.floor import close_all, ping_receiver, pinged_servers
    from priority_router.integration import install
    from workers.app import create_app
    from workers.local_redis import RedisDatabases

    tag = uuid.uuid4().hex[:8]
    env = {
        "BROKER_URL": RedisDatabases.from_url(redis_url).broker,
        "DOCUMENT_QUEUE": f"overhead-{tag}",
        "PRIORITY_ROUTER_REDIS_URL": store or RedisDatabases.from_url(redis_url).counter,
        "PRIORITY_ROUTER_KEY_PREFIX": f"overhead-{tag}:",
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
    }
    plain = create_app({**env, "WORKERS_ROUTER": "off"})
    routed = {
        mode: create_app(
            {
                **env,
                "WORKERS_ROUTER": "on",
                "PRIORITY_ROUTER_MODE": base_mode(mode),
                # A mode with a suffix counts under a prefix of its own.
                "PRIORITY_ROUTER_KEY_PREFIX": env["PRIORITY_ROUTER_KEY_PREFIX"]
                + mode.replace(":", "-")
                + ":",
            }
        )
        for mode in modes
    }
    clients = [f"c{n}" for n in range(100)]
    # The server each document's PING goes to: the counter's, or on a cluster its client's master.
    by_client = pinged_servers(env["PRIORITY_ROUTER_REDIS_URL"], clients)
    pinged = [by_client[c] for c in clients]
    for mode in modes:
        if mode.endswith(TIERED):
            from priority_router.router import installed_router

            router = installed_router(routed[mode])
            assert router is not None
            router.set_tier("some-other-client", shift=1)  # tiers are in use under this prefix
        if mode.endswith(COSTS):
            from priority_router.router import installed_router

            router = installed_router(routed[mode])
            assert router is not None
            router.record("some-other-client", "t", cost=2)  # costs are in use under this prefix
        if mode.endswith(CAPPED):
            from priority_router.router import installed_router

            router = installed_router(routed[mode])
            assert router is not None
            for n in range(100):
                router.set_tier(f"c{n}", max_in_flight=3, rate="100/s")
            router.set_default_tier(max_in_flight=10)
        if mode.endswith(UNWATCHED):
            from priority_router.integration.installation import installation_of

            installation = installation_of(routed[mode])
            assert installation is not None and installation.receiver.stranded_watch is not None
            installation.receiver.stranded_watch.stop()
            installation.receiver.stranded_watch = None

    cpu: dict[str, list[float]] = {}

    def publishes(app: Celery, name: str) -> Callable[[int], float]:
        cost = {"priority_router_cost": 2.5} if name.endswith(COSTED) else {}

        def run(count: int) -> float:
            started, cpu_started = time.perf_counter(), time.process_time()
            for n in range(count):
                client = f"c{n % 100}"
                headers = {"client_id": client, **cost}
                app.send_task("workers.hold_document", (client, f"d{n}", 0), headers=headers)
            cpu.setdefault(name, []).append((time.process_time() - cpu_started) / count)
            return (time.perf_counter() - started) / count

        return run

    def without_router(run: Callable[[int], float]) -> Callable[[int], float]:
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

    one_ping = ping_receiver(by_client)

    def floor(count: int) -> float:
        before_task_publish.connect(one_ping, dispatch_uid="publish-overhead-floor", weak=False)
        try:
            return without_router(publishes(plain, "floor"))(count)
        finally:
            before_task_publish.disconnect(dispatch_uid="publish-overhead-floor")

    ways = {
        "plain": without_router(publishes(plain, "plain")),
        **{mode: publishes(app, mode) for mode, app in routed.items()},
        "floor": floor,
        "ping": pings,
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for way in ways.values():  # connections, caches and the senders are built here
            way(300)
        cpu.clear()
        for n in range(blocks):
            order = list(ways) if n % 2 else list(reversed(ways))
            for name in order:
                times[name].append(ways[name](block))
    finally:
        for server in {id(s): s for s in pinged}.values():
            for key in server.scan_iter(match=f"overhead-{tag}*"):
                server.unlink(key)
        close_all(by_client)
        # The queue, its priority lists (one per step) and its bindings, whichever app made them.
        with redis.Redis.from_url(env["BROKER_URL"]) as broker:
            for pattern in (f"overhead-{tag}*", f"_kombu.binding*.overhead-{tag}"):
                for key in broker.scan_iter(match=pattern):
                    broker.unlink(key)
        for app in (plain, *routed.values()):
            app.close()
    floor_added = [f - p for p, f in zip(times["plain"], times["floor"], strict=True)]
    row: dict[str, Any] = {
        "plain_us": statistics.median(times["plain"]) * 1e6,
        "ping_us": statistics.median(times["ping"]) * 1e6,
        "floor_us": statistics.median(floor_added) * 1e6,
        "floor_pings": statistics.median(f / p for f, p in zip(floor_added, times["ping"], strict=True)),
        "floor_cpu_us": statistics.median(f - p for p, f in zip(cpu["plain"], cpu["floor"], strict=True))
        * 1e6,
    }
    added = {}
    for mode in modes:
        added[mode] = [r - p for p, r in zip(times["plain"], times[mode], strict=True)]
        row[mode] = {
            "router_us": statistics.median(times[mode]) * 1e6,
            "added_us": statistics.median(added[mode]) * 1e6,
            "added_pings": statistics.median(a / p for a, p in zip(added[mode], times["ping"], strict=True)),
            "added_floors": statistics.median(
                a / f for a, f in zip(added[mode], floor_added, strict=True) if f > 0
            ),
            # The publishing process's own CPU (user + system), without the Redis server's.
            "added_cpu_us": statistics.median(r - p for p, r in zip(cpu["plain"], cpu[mode], strict=True))
            * 1e6,
            # Beyond the floor's one round trip, block beside block: the router's own CPU.
            "beyond_floor_cpu_us": statistics.median(
                r - f for f, r in zip(cpu["floor"], cpu[mode], strict=True)
            )
            * 1e6,
        }
    for mode in modes[1:]:
        # The modes' added times, block beside block: what one mode costs against the other.
        row[mode][f"vs_{modes[0]}"] = statistics.median(
            a / b for a, b in zip(added[mode], added[modes[0]], strict=True) if b > 0
        )
        row[mode][f"cpu_vs_{modes[0]}"] = statistics.median(
            (m - p) / (f - p) for p, m, f in zip(cpu["plain"], cpu[mode], cpu[modes[0]], strict=True) if f > p
        )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
    parser.add_argument(
        "--processes", type=int, default=3, help="fresh publisher processes, one after another"
    )
    parser.add_argument("--blocks", type=int, default=30, help="alternating block triples per process")
    parser.add_argument("--block", type=int, default=100, help="publishes (or PINGs) per block")
    parser.add_argument(
        "--modes",
        "--mode",
        default="seed",
        help="the router's modes, comma-separated (seed, inflight, and seed:tiers or inflight:tiers "
        "for the same where a tier is stored, so each check reads the tier); blocks of each "
        "alternate, and every mode after the first is also compared with the first, block beside block",
    )
    parser.add_argument(
        "--cluster", type=int, help="the router's counter on a local Redis Cluster of N masters"
    )
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    redis_url = args.redis.rstrip("/")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    known = {base + suffix for base in ("seed", "inflight") for suffix in ("", *SUFFIXES)}
    unknown = sorted(set(modes) - known)
    if unknown or not modes or len(set(modes)) != len(modes):
        parser.error(f"--modes takes distinct modes among {', '.join(sorted(known))}, not {args.modes!r}")
    if args.child:
        print(json.dumps(child(redis_url, args.blocks, args.block, modes, args.store)))
        return

    rows = []
    with contextlib.ExitStack() as stack:
        store = None
        if args.cluster:
            from workers.cluster import running_cluster

            store = stack.enter_context(running_cluster(masters=args.cluster, replicas=0)).url
        for _ in range(max(1, args.processes)):
            command = [sys.executable, __file__, "--child", "--redis", redis_url]
            command += ["--blocks", str(args.blocks), "--block", str(args.block), "--modes", ",".join(modes)]
            command += ["--store", store] if store else []
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    if args.json:
        print(json.dumps({"modes": modes, "processes": rows}, indent=2))
        return
    where = f"counter on a {args.cluster}-master cluster" if args.cluster else "counter on the same Redis"
    print(
        f"{len(rows)} publisher processes x {args.blocks} alternating blocks of {args.block}, "
        f"Redis broker, {where}, modes {', '.join(modes)}, medians"
    )
    print(
        "| process | mode | plain us/publish | router us/publish | added us | PING us | added in PINGs "
        "| floor: one PING from the hook, us | floor in PINGs | added in floors | added CPU us "
        "| floor's added CPU us | CPU beyond the floor's us |"
        + "".join(f" vs {modes[0]} | CPU vs {modes[0]} |" for _ in modes[1:2])
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|" + "---|---|" * min(1, len(modes) - 1))
    for i, r in enumerate(rows, 1):
        for mode in modes:
            m = r[mode]
            versus = (
                f" {m[f'vs_{modes[0]}']:.3f} | {m[f'cpu_vs_{modes[0]}']:.3f} |"
                if mode != modes[0]
                else (" | |" if len(modes) > 1 else "")
            )
            print(
                f"| {i} | {mode} | {r['plain_us']:.0f} | {m['router_us']:.0f} | {m['added_us']:.0f} | "
                f"{r['ping_us']:.0f} | {m['added_pings']:.2f} | {r['floor_us']:.0f} | "
                f"{r['floor_pings']:.2f} | {m['added_floors']:.2f} | {m['added_cpu_us']:.0f} | "
                f"{r['floor_cpu_us']:.0f} | {m['beyond_floor_cpu_us']:.0f} |{versus}"
            )
    for mode in modes:
        added = statistics.median(r[mode]["added_us"] for r in rows)
        pings = statistics.median(r[mode]["added_pings"] for r in rows)
        floors = statistics.median(r[mode]["added_floors"] for r in rows)
        added_cpu = statistics.median(r[mode]["added_cpu_us"] for r in rows)
        beyond = statistics.median(r[mode]["beyond_floor_cpu_us"] for r in rows)
        beyond_range = [r[mode]["beyond_floor_cpu_us"] for r in rows]
        line = (
            f"{mode}: adds {added:.0f} us = {pings:.2f} round trips = {floors:.2f} floors, "
            f"{added_cpu:.0f} us of the publisher's CPU, {beyond:.0f} us "
            f"({min(beyond_range):.0f} to {max(beyond_range):.0f}) more than the floor's"
        )
        if mode != modes[0]:
            versus = statistics.median(r[mode][f"vs_{modes[0]}"] for r in rows)
            cpu_versus = statistics.median(r[mode][f"cpu_vs_{modes[0]}"] for r in rows)
            line += f"; {versus:.3f}x the time and {cpu_versus:.3f}x the CPU {modes[0]} adds"
        print(line)
    floor_us = statistics.median(r["floor_us"] for r in rows)
    floor_pings = statistics.median(r["floor_pings"] for r in rows)
    floor_cpu = statistics.median(r["floor_cpu_us"] for r in rows)
    print(
        f"one PING from the hook adds {floor_us:.0f} us = {floor_pings:.2f} round trips, "
        f"{floor_cpu:.0f} us of the publisher's CPU"
    )


if __name__ == "__main__":
    main()
