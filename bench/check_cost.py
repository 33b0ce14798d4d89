"""What one counter check costs the publishing process, in redis-py ``PING``s.

The same atomic check (increment the client's count, re-arm its expiry) sent four
ways, rounds interleaved in one process (no Celery signal is involved, so an
in-process comparison is fair), each normalised by a ``PING`` timed in the same round:

- ``packed``: what the router sends (``priority_router/store/packed.py``);
- ``packed+tier``: the same with the client's tier read in the transaction (``GET``), as
  the router sends it once a tier is in use;
- ``pipeline``: ``MULTI INCRBY PEXPIRE EXEC`` through redis-py's ``pipeline()``;
- ``evalsha``: one Lua script call doing both;
- ``ping``: the unit.

The server-side cost of the same choices is ``bench/counter_throughput.py``.

    python bench/check_cost.py [--redis redis://127.0.0.1:6379] [--rounds 7] [--checks 3000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from priority_router.config import RouterConfig  # noqa: E402
from priority_router.store.client_ids import client_key  # noqa: E402
from priority_router.store.counter import Counter  # noqa: E402
from workers.local_redis import redis_or_embedded  # noqa: E402

LUA = "local n = redis.call('INCRBY', KEYS[1], ARGV[2]) redis.call('PEXPIRE', KEYS[1], ARGV[1]) return n"
PREFIX = "check-cost:"


def strategies(client: redis.Redis) -> dict[str, Callable[[str], object]]:
    interval_ms = round(RouterConfig().reset_interval * 1000)
    counter = Counter(client, PREFIX, RouterConfig().reset_interval)
    sha = client.script_load(LUA)

    def pipeline(client_id: str) -> object:
        key = client_key(PREFIX, client_id)
        with client.pipeline(transaction=True) as pipe:
            pipe.incrby(key, 1)
            pipe.pexpire(key, interval_ms)
            return pipe.execute()[0]

    return {
        "ping": lambda _: client.ping(),
        "packed": counter.record,
        "packed+tier": lambda c: counter.count(c, tier=True),
        "pipeline": pipeline,
        "evalsha": lambda c: client.evalsha(sha, 1, client_key(PREFIX, c), interval_ms, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--checks", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=100)
    args = parser.parse_args()

    url, stop_redis = redis_or_embedded(args.redis.rstrip("/"))
    client = redis.Redis.from_url(f"{url}/12", socket_timeout=1, retry=None)
    ids = [f"c{i}" for i in range(args.clients)]
    try:
        ways = strategies(client)
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
        # Each round's figure is divided by the PING of the same round.
        pings = times["ping"]
        print(f"{args.rounds} interleaved rounds of {args.checks} checks, {args.clients} clients")
        print("| way | median us/check | in PINGs (median of rounds) | in PINGs (range of rounds) |")
        print("|---|---|---|---|")
        summary = {}
        for name, values in times.items():
            ratios = [v / p for v, p in zip(values, pings, strict=True)]
            ratio = statistics.median(ratios)
            summary[name] = {
                "us": statistics.median(values) * 1e6,
                "pings": ratio,
                "pings_range": [min(ratios), max(ratios)],
            }
            print(
                f"| {name} | {summary[name]['us']:.1f} | {ratio:.2f} | {min(ratios):.2f}-{max(ratios):.2f} |"
            )
        print(json.dumps(summary))
    finally:
        for key in client.scan_iter(match=PREFIX + "*"):
            client.unlink(key)
        client.close()
        stop_redis()


if __name__ == "__main__":
    main()
