"""Counter throughput against plain INCR, in the same run (memory: ``bench/memory.py``).

Sends pre-encoded pipelined commands over one socket and parses replies with
hiredis, so the figure is what the Redis server sustains, not the Python client.
Rounds are interleaved and the median ratio is reported (the machine is noisy).

    python bench/counter_throughput.py [--redis redis://127.0.0.1:6379]
"""

from __future__ import annotations

import argparse
import random
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import hiredis

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from priority_router.store.client_ids import INFLIGHT_SUFFIX, ORDER_SUFFIX, TIER_SUFFIX, client_key  # noqa: E402
from priority_router.store.costs import RESOLUTION, SENTINEL  # noqa: E402
from priority_router.store.inflight import member  # noqa: E402
from priority_router.store.packed import EXEC, MULTI, command  # noqa: E402
from workers.local_redis import redis_or_embedded  # noqa: E402

INTERVAL_MS = b"1500000"
LUA = "local n = redis.call('INCR', KEYS[1]) redis.call('PEXPIRE', KEYS[1], ARGV[1]) return n"
PUBLISH_INFLIGHT = (ROOT / "priority_router" / "store" / "lua" / "publish_inflight.lua").read_bytes()


def in_multi(queued: Callable[[bytes], list[bytes]]) -> tuple[Callable[[bytes], bytes], int]:
    """A variant that sends ``queued(key)`` in one ``MULTI ... EXEC``, and its reply count
    (``+OK``, one ``+QUEUED`` per command, the ``EXEC`` array)."""

    def encode(k: bytes) -> bytes:
        return MULTI + b"".join(queued(k)) + EXEC

    return encode, len(queued(b"k")) + 2


def rate(
    sock: socket.socket, encode: Callable[[bytes], bytes], replies: int, keys: list[bytes], batch: int = 2000
) -> float:
    payloads = [b"".join(encode(k) for k in keys[i : i + batch]) for i in range(0, len(keys), batch)]
    reader = hiredis.Reader()
    start = time.perf_counter()
    for i, payload in enumerate(payloads):
        sock.sendall(payload)
        need = min(batch, len(keys) - i * batch) * replies
        while need:
            reader.feed(sock.recv(1 << 20))
            while need and reader.gets() is not False:
                need -= 1
    return len(keys) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--checks", type=int, default=200_000)
    parser.add_argument("--clients", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    url, stop_redis = redis_or_embedded(args.redis)
    try:
        parts = urlsplit(url)
        db = b"12"
        sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379))
        sock.sendall(
            command(b"SELECT", db)
            + command(b"SCRIPT", b"LOAD", LUA.encode())
            + command(b"SCRIPT", b"LOAD", PUBLISH_INFLIGHT)
        )
        reader = hiredis.Reader()
        got: list[object] = []
        while len(got) < 3:
            reader.feed(sock.recv(4096))
            while (reply := reader.gets()) is not False:
                got.append(reply)
        sha, publish_sha = (g if isinstance(g, bytes) else str(g).encode() for g in got[1:])

        rng = random.Random(1)
        keys = [
            client_key("priority-router:", f"client-{rng.randrange(args.clients)}").encode()
            for _ in range(args.checks)
        ]
        variants: dict[str, tuple[Callable[[bytes], bytes], int]] = {
            "INCR (baseline)": (lambda k: command(b"INCR", k), 1),
            "batch check: MULTI INCRBY PEXPIRE EXEC": in_multi(
                lambda k: [command(b"INCRBY", k, b"1"), command(b"PEXPIRE", k, INTERVAL_MS)]
            ),
            "router check: MULTI INCR PEXPIRE EXEC": in_multi(
                lambda k: [command(b"INCR", k), command(b"PEXPIRE", k, INTERVAL_MS)]
            ),
            "router check with the tier: MULTI INCR PEXPIRE GET EXEC": in_multi(
                lambda k: [
                    command(b"INCR", k),
                    command(b"PEXPIRE", k, INTERVAL_MS),
                    command(b"GET", k + TIER_SUFFIX.encode()),
                ]
            ),
            "inflight publish with the tier: publish_inflight.lua": (
                lambda k: command(
                    b"EVALSHA",
                    publish_sha,
                    b"3",
                    k + INFLIGHT_SUFFIX.encode(),
                    k + TIER_SUFFIX.encode(),
                    k + ORDER_SUFFIX.encode(),
                    member(str(random.random())),
                    b"0",
                    INTERVAL_MS,
                    b"1",
                    b"0",
                    SENTINEL,
                    b"%d" % RESOLUTION,
                ),
                1,
            ),
            "the same without keeping order: MULTI LPUSH PEXPIRE GET EXEC": in_multi(
                lambda k: [
                    command(b"LPUSH", k + INFLIGHT_SUFFIX.encode(), member(k.decode())),
                    command(b"PEXPIRE", k + INFLIGHT_SUFFIX.encode(), INTERVAL_MS),
                    command(b"GET", k + TIER_SUFFIX.encode()),
                ]
            ),
            "Lua INCR+PEXPIRE (EVALSHA)": (lambda k: command(b"EVALSHA", sha, b"1", k, INTERVAL_MS), 1),
            "INCR; PEXPIRE (no MULTI)": (
                lambda k: command(b"INCR", k) + command(b"PEXPIRE", k, INTERVAL_MS),
                2,
            ),
            "PEXPIRE; SET NX PX; INCR": (
                lambda k: (
                    command(b"PEXPIRE", k, INTERVAL_MS)
                    + command(b"SET", k, b"0", b"NX", b"PX", INTERVAL_MS)
                    + command(b"INCR", k)
                ),
                3,
            ),
        }
        results: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, (encode, replies) in variants.items():
                results[name].append(rate(sock, encode, replies, keys))

        base = statistics.median(results["INCR (baseline)"])
        print(f"{args.checks} checks over {args.clients} clients, {args.rounds} interleaved rounds, medians")
        print("| operation | checks/s | vs INCR | spread (each round vs its INCR) |")
        print("|---|---|---|---|")
        for name, rates in results.items():
            med = statistics.median(rates)
            ratios = [r / b for r, b in zip(rates, results["INCR (baseline)"], strict=True)]
            spread = f"{min(ratios):.2f}-{max(ratios):.2f}x"
            print(f"| {name} | {med / 1000:.0f}k | {med / base:.2f}x | {spread} |")

    finally:
        stop_redis()


if __name__ == "__main__":
    main()
