"""Redis memory per active client, with the default key prefix.

Starts a throwaway ``redis-server`` on a free port (no persistence), reads ``INFO
memory`` ``used_memory``, then loads ``--clients`` clients exactly as the router's check
leaves them: the key from ``priority_router.store.client_ids.client_key`` with
``RouterConfig``'s default prefix, and the check's own commands, ``MULTI; INCR key;
PEXPIRE key <reset_interval in ms>; EXEC``, one check per client, many checks per round
trip.  A PTTL per key then checks that every client has one key with its TTL (each
lookup also moves Redis's incremental rehash on), and once ``DEBUG HTSTATS`` shows no
dict rehashing (7.0+: the throwaway server allows DEBUG locally; older ones: once
``used_memory`` holds still) it reads ``used_memory`` again on a fresh connection and
reports the difference per client, with ``DBSIZE`` and the keys with an expiry as
checks.  ``MEMORY STATS`` gives Redis's own estimate of the two hash tables (keys and
expiries); the rest is key strings, values and allocator rounding.  The server is shut
down at the end.

The bucket arrays are powers of two, so the figure depends on where ``--clients`` falls:
1,000,000 fills 2**20 buckets to 95% (near the cheapest point, 2**20 clients), while 1,048,577 needs 2**21
and costs about 15 bytes more per client.

Client ids look like ``client-000123`` (zero-padded to at least 6 digits).  Memory per
key depends on the server version and on ``maxmemory-policy``: under an LRU/LFU policy
with a ``maxmemory``, Redis stops sharing small integer values, so ``--maxmemory-policy``
measures that case.

``--mode inflight`` loads the inflight mode's lists instead, one document in flight per
client.  Redis 7.2 and later keep a short list as one ``listpack``; 7.0 wraps it in a
``quicklist`` and a node of their own, about 100 bytes more: ``--redis-server`` measures
another server.  ``--costed`` gives every client's document a cost of 2.5, so each client
also has its extras (``store/costs.py``): a key of its own in the seed mode, one list entry
more in the inflight mode.

    python bench/memory.py [--clients 1000000] [--mode seed|inflight] [--costed] [--redis-server PATH]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import hiredis
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from bench.provenance import code_version  # noqa: E402
from priority_router.config import RouterConfig  # noqa: E402
from priority_router.store.client_ids import client_key, inflight_key  # noqa: E402
from priority_router.store.costs import RESOLUTION, sentinel  # noqa: E402
from priority_router.store.inflight import member  # noqa: E402
from priority_router.store.packed import EXEC, MULTI, command  # noqa: E402
from workers.local_redis import EmbeddedRedis, start_embedded_redis  # noqa: E402


def server_version(executable: str) -> tuple[int, ...]:
    out = subprocess.run([executable, "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"v=(\d+)\.(\d+)", out)
    return tuple(int(x) for x in found.groups()) if found else (0, 0)


def start_server(executable: str, extra: list[str]) -> EmbeddedRedis:
    if server_version(executable) >= (7, 0):
        extra = [*extra, "--enable-debug-command", "local"]  # DEBUG HTSTATS: is it rehashing?
    return start_embedded_redis(executable=executable, extra=extra)


def load(
    port: int, keys: list[bytes], interval_ms: int, batch: int, inflight: bool = False, costed: bool = False
) -> float:
    """Send one check per key, ``batch`` checks per round trip; returns the seconds it took.

    ``inflight``: the inflight mode's publish instead, one document in flight per client:
    what ``publish_inflight.lua`` leaves for a client checked at 0 (its list alone, no order
    key), written as ``MULTI; LPUSH key m; PEXPIRE key ms; EXEC``.  ``costed``: the document costs 2.5
    (``...; INCRBY extras 1500; PEXPIRE extras ms; EXEC``)."""
    expiry = str(interval_ms).encode()
    extra = round(1.5 * RESOLUTION)

    def check(k: bytes) -> bytes:
        m = member(str(uuid.uuid4()), extra if costed else 0)
        counted = command(b"LPUSH", k, m) if inflight else command(b"INCR", k)
        extras = b""
        if costed and inflight:  # what lua/publish_inflight.lua leaves for a new client
            extras = command(b"RPUSH", k, sentinel(extra))
        elif costed:
            x = k + b":c"
            extras = command(b"INCRBY", x, b"%d" % extra) + command(b"PEXPIRE", x, expiry)
        return MULTI + counted + extras + command(b"PEXPIRE", k, expiry) + EXEC

    if costed and inflight:
        queued, new_client = 3, [1, 2, 1]
    elif costed:
        queued, new_client = 4, [1, extra, 1, 1]
    else:
        queued, new_client = 2, [1, 1]  # EXEC: a count (or length) of 1, and the expiry set
    reader = hiredis.Reader()
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for i in range(0, len(keys), batch):
            chunk = keys[i : i + batch]
            sock.sendall(b"".join(check(k) for k in chunk))
            need = (queued + 2) * len(chunk)
            while need:
                reader.feed(sock.recv(1 << 20))
                while need and (reply := reader.gets()) is not False:
                    if isinstance(reply, hiredis.ReplyError):
                        raise RuntimeError(f"the check failed: {reply}")
                    if isinstance(reply, list) and reply != new_client:
                        raise RuntimeError(f"a client was not new, or got no expiry: EXEC -> {reply}")
                    need -= 1
    return time.perf_counter() - start


def used_memory(port: int) -> int:
    with redis.Redis(port=port) as r:
        return int(r.info("memory")["used_memory"])


def check_ttls(port: int, keys: list[bytes], interval_ms: int, batch: int) -> int:
    """How many keys have a TTL in (0, interval_ms]; one PTTL per key, pipelined.

    Every lookup also moves the server's incremental rehash on by a step, so a dict that
    grew near the end of the load finishes rehashing here rather than minutes later.
    """
    good = 0
    with redis.Redis(port=port) as r:
        for i in range(0, len(keys), batch):
            with r.pipeline(transaction=False) as pipe:
                for k in keys[i : i + batch]:
                    pipe.pttl(k)
                good += sum(1 for ttl in pipe.execute() if 0 < int(ttl) <= interval_ms)
    return good


def rehashing(port: int) -> bool | None:
    """Whether db 0's dicts are still rehashing; None when DEBUG is not allowed."""
    with redis.Redis(port=port) as r:
        try:
            stats = r.execute_command("DEBUG", "HTSTATS", "0")
        except redis.ResponseError:
            return None
    text = stats.decode() if isinstance(stats, bytes) else str(stats)
    return "rehashing" in text


def settled_memory(port: int, timeout: float = 300) -> tuple[int, float]:
    """``used_memory`` once no dict is rehashing, and the seconds that took.

    A dict that grew during the load keeps both bucket arrays until its incremental
    rehash is done.  Without DEBUG, wait until ``used_memory`` holds still.
    """
    start = time.monotonic()
    last, still = used_memory(port), 0
    while time.monotonic() - start < timeout:
        busy = rehashing(port)
        if busy is False or (busy is None and still >= 3):
            break
        time.sleep(0.5)
        now = used_memory(port)
        still = still + 1 if now == last else 0
        last = now
    return used_memory(port), time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=5000, help="checks per round trip")
    parser.add_argument("--redis-server", default=shutil.which("redis-server"), help="the server to start")
    parser.add_argument(
        "--mode", choices=["seed", "inflight"], default="seed", help="the router mode whose keys to load"
    )
    parser.add_argument("--costed", action="store_true", help="every document costs 2.5")
    parser.add_argument(
        "--maxmemory-policy", help="e.g. allkeys-lru (sets maxmemory 16gb too); default: the server's"
    )
    args = parser.parse_args()
    if not args.redis_server:
        parser.error("no redis-server on PATH: give --redis-server")

    config = RouterConfig()
    prefix = config.key_prefix
    interval_ms = max(1, round(config.reset_interval * 1000))
    width = max(6, len(str(args.clients - 1)))
    key_of = inflight_key if args.mode == "inflight" else client_key
    keys = [key_of(prefix, f"client-{i:0{width}d}").encode() for i in range(args.clients)]

    extra = (
        ["--maxmemory", "16gb", "--maxmemory-policy", args.maxmemory_policy] if args.maxmemory_policy else []
    )
    server = start_server(args.redis_server, extra)
    port = server.port
    try:
        with redis.Redis(port=port) as r:
            version = str(r.info("server")["redis_version"])
            policy = str(r.config_get("maxmemory-policy")["maxmemory-policy"])
        before = used_memory(port)
        seconds = load(port, keys, interval_ms, args.batch, args.mode == "inflight", args.costed)
        with_ttl = check_ttls(port, keys, interval_ms, args.batch)
        after, settle = settled_memory(port)
        with redis.Redis(port=port) as r:
            dbsize = int(r.dbsize())
            expiring = int(r.info("keyspace").get("db0", {}).get("expires", 0))
            stats: dict[str, Any] = r.memory_stats()
            sample = keys[len(keys) // 2]
            sample_usage = int(r.memory_usage(sample) or 0)
            sample_ttl = int(r.pttl(sample))
    finally:
        try:
            with redis.Redis(port=port) as r:
                r.shutdown(nosave=True)
        except redis.RedisError:
            pass  # stop below ends it anyway
        server.stop()

    n = args.clients
    delta = after - before
    db0 = stats.get("db.0", {})
    main_table = int(db0.get("overhead.hashtable.main", 0))
    expires_table = int(db0.get("overhead.hashtable.expires", 0))
    result = {
        "benchmark": "memory",
        "mode": args.mode,
        "costed": args.costed,
        "redis_version": version,
        "code": code_version(),
        "maxmemory_policy": policy,
        "prefix": prefix,
        "clients": n,
        "sample_key": sample.decode(),
        "used_memory_before": before,
        "used_memory_after": after,
        "delta_bytes": delta,
        "bytes_per_client": round(delta / n, 1),
        "dbsize": dbsize,
        "keys_with_expiry": expiring,
        "keys_with_ttl_in_range": with_ttl,
        "main_table_bytes_per_client": round(main_table / n, 1),
        "expires_table_bytes_per_client": round(expires_table / n, 1),
        "memory_usage_sample_key": sample_usage,
        "sample_pttl_ms": sample_ttl,
        "load_seconds": round(seconds, 2),
        "settle_seconds": round(settle, 1),
    }
    print(
        f"Redis {version}, mode {args.mode}, maxmemory-policy {policy}, prefix {prefix!r}, {n} clients "
        f"(keys like {sample.decode()!r}), TTL {interval_ms} ms, loaded in {seconds:.1f} s; "
        f"no rehash pending {settle:.1f} s after the TTL check; "
        f"code {code_version()}"
    )
    print("| measure | value |")
    print("|---|---|")
    print(f"| used_memory before | {before} B |")
    print(f"| used_memory after | {after} B |")
    print(f"| delta | {delta} B |")
    print(f"| **bytes per active client** | **{delta / n:.1f}** |")
    print(f"| of which, by MEMORY STATS: main dict (entries, key objects, buckets) | {main_table / n:.1f} |")
    print(f"| of which, by MEMORY STATS: expires dict (entries, buckets) | {expires_table / n:.1f} |")
    rest = (delta - main_table - expires_table) / n
    print(f"| the rest: key strings, values, allocator rounding | {rest:.1f} |")
    print(f"| DBSIZE | {dbsize} |")
    print(f"| keys with an expiry | {expiring} |")
    print(f"| keys whose PTTL is in (0, {interval_ms}] | {with_ttl} |")
    print(f"| MEMORY USAGE of {sample.decode()!r} | {sample_usage} B (PTTL {sample_ttl} ms) |")
    print(json.dumps(result))
    if not dbsize == expiring == with_ttl == n:
        raise SystemExit(f"expected {n} keys, all with the TTL; got {dbsize}, {expiring}, {with_ttl}")


if __name__ == "__main__":
    main()
