"""What the counter store pays, on the Redis server: one script, one switch per way of asking.

    python bench/store.py throughput [--clients N]   # checks/s the server sustains, against INCR
    python bench/store.py memory [--clients 1000000] [--mode inflight] [--costed]   # bytes per client
    python bench/store.py end [--in-flight 100,1000,10000,100000]   # the inflight mode's end, in PEXPIREs
    python bench/store.py gate [--docs 2000]         # the workers' gate per limited document, in PINGs

``python bench/store.py WAY --help`` says what each measures and takes.  Commands are sent
pre-encoded and pipelined over one socket, replies parsed with hiredis, so the figures are
the server's, not the Python client's (``gate`` times calls from the worker's side instead).
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import hiredis
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from bench.provenance import code_version  # noqa: E402
from priority_router.config import RouterConfig  # noqa: E402
from priority_router.limits import Limits  # noqa: E402
from priority_router.store.client_ids import (  # noqa: E402
    INFLIGHT_SUFFIX,
    ORDER_SUFFIX,
    TIER_SUFFIX,
    client_key,
    inflight_key,
)
from priority_router.store.costs import RESOLUTION, SENTINEL, sentinel  # noqa: E402
from priority_router.store.gate import GateStore  # noqa: E402
from priority_router.store.inflight import InflightCounter, member  # noqa: E402
from priority_router.store.packed import EXEC, MULTI, command  # noqa: E402
from workers.local_redis import redis_or_embedded, start_embedded_redis  # noqa: E402

INTERVAL_MS = b"1500000"
LUA = "local n = redis.call('INCR', KEYS[1]) redis.call('PEXPIRE', KEYS[1], ARGV[1]) return n"
PUBLISH_INFLIGHT = (ROOT / "priority_router" / "store" / "lua" / "publish_inflight.lua").read_bytes()


def pipelined(
    sock: socket.socket, payloads: list[bytes], replies: list[int], check: Callable[[Any], None] = print
) -> float:
    """Send each payload and read its ``replies`` replies (each passed to ``check``); seconds."""
    reader = hiredis.Reader()
    start = time.perf_counter()
    for payload, need in zip(payloads, replies, strict=True):
        sock.sendall(payload)
        while need:
            reader.feed(sock.recv(1 << 20))
            while need and (reply := reader.gets()) is not False:
                check(reply)
                need -= 1
    return time.perf_counter() - start


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


# --- throughput -------------------------------------------------------------------------------


def throughput(args: argparse.Namespace) -> None:
    """Checks per second the server sustains over ``--clients`` clients, each way of writing a
    check against a plain ``INCR`` in interleaved rounds (median, and each round's ratio to
    its own ``INCR``): the router's ``MULTI INCR PEXPIRE EXEC``, with the tier's ``GET``, the
    batch check, the inflight mode's script and its order-free transaction, a Lua script, and
    two rejected designs (no ``MULTI``; ``PEXPIRE; SET NX PX; INCR``)."""
    url, stop_redis = redis_or_embedded(args.redis)
    try:
        parts = urlsplit(url)
        sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379))
        got: list[bytes] = []
        load = command(b"SCRIPT", b"LOAD", LUA.encode()) + command(b"SCRIPT", b"LOAD", PUBLISH_INFLIGHT)
        pipelined(sock, [command(b"SELECT", b"12") + load], [3], lambda r: got.append(r))
        sha, publish_sha = (g if isinstance(g, bytes) else str(g).encode() for g in got[1:])
        rng = random.Random(1)
        keys = [
            client_key("priority-router:", f"client-{rng.randrange(args.clients)}").encode()
            for _ in range(args.checks)
        ]
        tier, inflight, order = (s.encode() for s in (TIER_SUFFIX, INFLIGHT_SUFFIX, ORDER_SUFFIX))

        def multi(*queued: Callable[[bytes], bytes]) -> tuple[Callable[[bytes], bytes], int]:
            return (lambda k: MULTI + b"".join(q(k) for q in queued) + EXEC), len(queued) + 2

        def incr(k: bytes) -> bytes:
            return command(b"INCR", k)

        def pexpire(k: bytes) -> bytes:
            return command(b"PEXPIRE", k, INTERVAL_MS)

        ways: dict[str, tuple[Callable[[bytes], bytes], int]] = {
            "INCR (baseline)": (incr, 1),
            "batch check: MULTI INCRBY PEXPIRE EXEC": multi(lambda k: command(b"INCRBY", k, b"1"), pexpire),
            "router check: MULTI INCR PEXPIRE EXEC": multi(incr, pexpire),
            "router check with the tier: MULTI INCR PEXPIRE GET EXEC": multi(
                incr, pexpire, lambda k: command(b"GET", k + tier)
            ),
            "inflight publish with the tier: publish_inflight.lua": (
                lambda k: command(
                    b"EVALSHA",
                    publish_sha,
                    b"3",
                    k + inflight,
                    k + tier,
                    k + order,
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
            "the same without keeping order: MULTI LPUSH PEXPIRE GET EXEC": multi(
                lambda k: command(b"LPUSH", k + inflight, member(k.decode())),
                lambda k: pexpire(k + inflight),
                lambda k: command(b"GET", k + tier),
            ),
            "Lua INCR+PEXPIRE (EVALSHA)": (lambda k: command(b"EVALSHA", sha, b"1", k, INTERVAL_MS), 1),
            "INCR; PEXPIRE (no MULTI)": (lambda k: incr(k) + pexpire(k), 2),
            "PEXPIRE; SET NX PX; INCR": (
                lambda k: pexpire(k) + command(b"SET", k, b"0", b"NX", b"PX", INTERVAL_MS) + incr(k),
                3,
            ),
        }
        rates: dict[str, list[float]] = {name: [] for name in ways}
        chunks = [keys[i : i + 2000] for i in range(0, len(keys), 2000)]
        for _ in range(args.rounds):
            for name, (encode, replies) in ways.items():
                payloads = [b"".join(encode(k) for k in chunk) for chunk in chunks]
                seconds = pipelined(sock, payloads, [len(c) * replies for c in chunks], lambda r: None)
                rates[name].append(len(keys) / seconds)
    finally:
        stop_redis()
    base = rates["INCR (baseline)"]
    print(f"{args.checks} checks over {args.clients} clients, {args.rounds} interleaved rounds, medians")
    print("| operation | checks/s | vs INCR (each round vs its INCR) |\n|---|---|---|")
    for name, values in rates.items():
        ratios = [r / b for r, b in zip(values, base, strict=True)]
        print(f"| {name} | {statistics.median(values) / 1000:.0f}k | {spread(ratios)} |")


# --- memory -----------------------------------------------------------------------------------


def settled_memory(r: redis.Redis, timeout: float = 300) -> tuple[int, float]:
    """``used_memory`` once no dict is rehashing (``DEBUG HTSTATS``; without DEBUG, once it
    holds still), and the seconds that took: a dict that grew during the load keeps both
    bucket arrays until its incremental rehash is done."""
    start = time.monotonic()
    last, still = int(r.info("memory")["used_memory"]), 0
    while time.monotonic() - start < timeout:
        try:
            busy: bool | None = "rehashing" in str(r.execute_command("DEBUG", "HTSTATS", "0"))
        except redis.ResponseError:
            busy = None
        if busy is False or (busy is None and still >= 3):
            break
        time.sleep(0.5)
        now = int(r.info("memory")["used_memory"])
        still, last = (still + 1 if now == last else 0), now
    return int(r.info("memory")["used_memory"]), time.monotonic() - start


def memory(args: argparse.Namespace) -> None:
    """Redis memory per active client, with the default key prefix: a throwaway
    ``redis-server`` (``--redis-server``; no persistence) loaded with ``--clients`` clients
    exactly as the router's check leaves them (``MULTI; INCR key; PEXPIRE key ms; EXEC``,
    the key ``client_key`` makes with ``RouterConfig``'s prefix), many checks per round trip;
    a ``PTTL`` per key then checks every client has its key and TTL (and moves the
    incremental rehash on); once no dict is rehashing, the ``used_memory`` difference per
    client, with ``MEMORY STATS``'s two hash tables (keys, expiries) and the rest.  The
    tables are powers of two: 1,000,000 clients fill 2**20 buckets to 95%, 1,048,577 need
    2**21.  ``--maxmemory-policy allkeys-lru`` (with a ``maxmemory``) stops Redis sharing
    small integers.  ``--mode inflight`` loads the inflight mode's lists, one document in
    flight per client (Redis 7.2+ keeps a short list as one listpack, 7.0 as a quicklist and
    a node).  ``--costed``: every document costs 2.5, so each client also has its extras."""
    if not args.redis_server:
        raise SystemExit("no redis-server on PATH: give --redis-server")
    config = RouterConfig()
    prefix, interval_ms = config.key_prefix, max(1, round(config.reset_interval * 1000))
    expiry, extra = str(interval_ms).encode(), round(1.5 * RESOLUTION)
    inflight = args.mode == "inflight"
    key_of = inflight_key if inflight else client_key
    width = max(6, len(str(args.clients - 1)))
    keys = [key_of(prefix, f"client-{i:0{width}d}").encode() for i in range(args.clients)]

    def check(k: bytes) -> bytes:
        m = member(str(uuid.uuid4()), extra if args.costed else 0)
        counted = command(b"LPUSH", k, m) if inflight else command(b"INCR", k)
        extras = b""
        if args.costed and inflight:  # what lua/publish_inflight.lua leaves for a new client
            extras = command(b"RPUSH", k, sentinel(extra))
        elif args.costed:
            extras = command(b"INCRBY", k + b":c", b"%d" % extra) + command(b"PEXPIRE", k + b":c", expiry)
        return MULTI + counted + extras + command(b"PEXPIRE", k, expiry) + EXEC

    # EXEC's reply for a new client: a count (or length) of 1, the extras, the expiry set.
    new_client = [1, 2, 1] if args.costed and inflight else [1, extra, 1, 1] if args.costed else [1, 1]

    def is_new(reply: Any) -> None:
        if isinstance(reply, hiredis.ReplyError) or (isinstance(reply, list) and reply != new_client):
            raise RuntimeError(f"a client was not new, or got no expiry: {reply}")

    version = subprocess.run([args.redis_server, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"v=(\d+)\.(\d+)", version)
    extra_args = (
        ["--maxmemory", "16gb", "--maxmemory-policy", args.maxmemory_policy] if args.maxmemory_policy else []
    )
    if found and (int(found[1]), int(found[2])) >= (7, 0):
        extra_args += ["--enable-debug-command", "local"]  # DEBUG HTSTATS: is it rehashing?
    server = start_embedded_redis(executable=args.redis_server, extra=extra_args)
    chunks = [keys[i : i + args.batch] for i in range(0, len(keys), args.batch)]
    payloads = [b"".join(check(k) for k in chunk) for chunk in chunks]
    try:
        with redis.Redis(port=server.port) as r:  # each step on a connection of its own
            version = str(r.info("server")["redis_version"])
            policy = str(r.config_get("maxmemory-policy")["maxmemory-policy"])
            before = int(r.info("memory")["used_memory"])
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            seconds = pipelined(sock, payloads, [len(c) * (len(new_client) + 2) for c in chunks], is_new)
        with_ttl = 0
        with redis.Redis(port=server.port) as r:
            for chunk in chunks:
                with r.pipeline(transaction=False) as pipe:
                    for k in chunk:
                        pipe.pttl(k)
                    with_ttl += sum(1 for ttl in pipe.execute() if 0 < int(ttl) <= interval_ms)
        with redis.Redis(port=server.port) as r:
            after, settle = settled_memory(r)
            dbsize = int(r.dbsize())
            expiring = int(r.info("keyspace").get("db0", {}).get("expires", 0))
            db0 = r.memory_stats().get("db.0", {})
    finally:
        server.stop()
    n, delta = args.clients, after - before
    tables = {t: int(db0.get(f"overhead.hashtable.{t}", 0)) / n for t in ("main", "expires")}
    print(
        f"Redis {version}, mode {args.mode}{', costed' if args.costed else ''}, maxmemory-policy {policy}, "
        f"{n} clients (keys like {keys[n // 2].decode()!r}), loaded in {seconds:.1f} s, settled in "
        f"{settle:.1f} s, code {code_version()}"
    )
    print(
        f"**{delta / n:.1f} B per active client** ({delta} B): main dict {tables['main']:.1f}, "
        f"expires dict {tables['expires']:.1f}, the rest (key strings, values, allocator rounding) "
        f"{delta / n - tables['main'] - tables['expires']:.1f}; DBSIZE {dbsize}, {expiring} with an "
        f"expiry, {with_ttl} with their TTL"
    )
    if not dbsize == expiring == with_ttl == n:
        raise SystemExit(f"expected {n} keys, all with the TTL; got {dbsize}, {expiring}, {with_ttl}")


# --- end --------------------------------------------------------------------------------------


def server_usec(client: redis.Redis, name: str) -> tuple[int, float]:
    stats = client.info("commandstats").get(f"cmdstat_{name}", {})
    return int(stats.get("calls", 0)), float(stats.get("usec", 0))


def end(args: argparse.Namespace) -> None:
    """What ending a document costs Redis in the inflight mode, by how much its client has in
    flight: the end is ``MULTI; LREM key -1 m; PEXPIRE key ms; EXEC``, and ``LREM -1`` walks
    the list from its oldest entry.  For each ``--in-flight`` N, ``--ends`` ends on a list
    the router's own publish built: ``oldest first`` (as a queue serves one client), ``newest
    first`` (each walks past every older document) and ``not there`` (an end seen twice: the
    whole list is read).  The server's own µs per ``LREM`` (``INFO commandstats``) on a
    throwaway server, next to a ``PEXPIRE``'s."""
    server = start_embedded_redis(executable=args.redis_server)
    client = redis.Redis.from_url(server.url)
    rows = []
    try:
        version = client.info("server")["redis_version"]
        client.config_resetstat()
        client.set("unit", 1)
        for _ in range(2000):
            client.pexpire("unit", 100_000)
        calls, usec = server_usec(client, "pexpire")
        unit = usec / calls
        counter = InflightCounter(client, "inflight-end:", 1500)
        for size in (int(n) for n in args.in_flight.split(",")):
            ends, row = min(args.ends, size), [size]
            for order in ("oldest first", "newest first", "not there"):
                client_id = f"c-{order}-{size}"
                ids = [str(uuid.uuid4()) for _ in range(size)]
                for task_id in ids:
                    counter.record(client_id, task_id)
                targets = {"oldest first": ids[:ends], "newest first": ids[::-1][:ends]}.get(order)
                targets = targets or [str(uuid.uuid4()) for _ in range(ends)]
                before = server_usec(client, "lrem")
                ended = sum(counter.end(client_id, t) is not None for t in targets)
                after = server_usec(client, "lrem")
                if ended != (0 if order == "not there" else ends):
                    raise RuntimeError(f"{order}: {ended} ends took effect of {ends}")
                counter.clear(client_id)
                row.append((after[1] - before[1]) / max(1, after[0] - before[0]))
            rows.append(row)
    finally:
        client.close()
        server.stop()
    print(f"Redis {version}, server µs per LREM (PEXPIRE: {unit:.2f} µs), {code_version()}")
    print("| documents in flight | oldest first | newest first | not there |\n|---|---|---|---|")
    for size, *cells in rows:
        print(f"| {size:,} | " + " | ".join(f"{c:.2f} µs ({c / unit:.1f}x)" for c in cells) + " |")


# --- gate -------------------------------------------------------------------------------------


class Held:
    """A held document, in a holding queue kept in memory: the broker's part is not measured."""

    units = 1000

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id

    def send(self) -> None: ...

    def drop(self) -> None: ...

    def put_back(self) -> None:
        raise AssertionError("the bench's releases are never blocked")


class Queue:
    def __init__(self, ids: list[str]) -> None:
        self.ids = list(reversed(ids))

    def take(self) -> Held | None:
        return Held(self.ids.pop()) if self.ids else None


def gate(args: argparse.Namespace) -> None:
    """What the worker's gate adds per document of a limited client, against a ``PING`` on
    the same connection (round-trip time dominates both), on a throwaway Redis: ``admit``
    (received under its cap), ``end`` (its slot freed, nothing to release), ``hold`` (counted
    held; the holding queue's publish is the broker's, not counted) and ``end + release`` (an
    end that releases a held document: the end, the take that reserves its slot and the mark
    that it was sent).  A client without limits costs the gate one dictionary lookup, and
    publishers never read limits.  Medians of five rounds."""

    def per_call(calls: int, run: Callable[[int], object]) -> float:
        rounds = []
        for _ in range(5):
            started = time.perf_counter()
            for i in range(calls):
                run(i)
            rounds.append((time.perf_counter() - started) / calls * 1e6)
        return statistics.median(rounds)

    server = start_embedded_redis()
    client = redis.Redis.from_url(server.url)
    try:
        store = GateStore(client, "gate-bench:")
        roomy, tight = Limits(max_in_flight=1_000_000), Limits(max_in_flight=1)
        ids, n = [f"d{i}" for i in range(args.docs)], args.docs
        ping = per_call(n, lambda i: client.ping())
        admit = per_call(n, lambda i: store.admit("roomy", f"{i}-{uuid.uuid4()}", roomy, 1000))
        for i in ids:
            store.admit("ends", i, roomy, 1000)
        ended = per_call(1, lambda _: [store.end("ends", i, roomy) for i in ids]) / n

        def hold_all() -> None:
            stale = list(client.scan_iter("gate-bench:{tight}*"))
            if stale:
                client.delete(*stale)
            for i in ["runner", *ids]:
                store.admit("tight", i, tight, 1000)

        hold = per_call(1, lambda _: hold_all()) / n
        queue = Queue(ids)

        def end_and_release(task_id: str) -> None:  # each end frees the slot and releases the next
            store.release("tight", tight, store.end("tight", task_id, tight), queue, 3_900_000, most=1)

        release = per_call(1, lambda _: [end_and_release(i) for i in ["runner", *ids[:-1]]]) / n
    finally:
        client.close()
        server.stop()
    print(f"the gate per limited document, {n} documents, {code_version()}")
    print("| call | µs per call | in PINGs |\n|---|---|---|")
    for name, us in (
        ("PING", ping),
        ("admit", admit),
        ("end", ended),
        ("hold", hold),
        ("end + release", release),
    ):
        print(f"| {name} | {us:.1f} | {us / ping:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ways = parser.add_subparsers(dest="way", required=True, metavar="WAY")

    def way(name: str, run: Callable[[argparse.Namespace], None]) -> argparse.ArgumentParser:
        sub = ways.add_parser(name, description=run.__doc__, help=(run.__doc__ or "").split("\n")[0])
        sub.set_defaults(run=run)
        return sub

    sub = way("throughput", throughput)
    sub.add_argument("--redis", default="redis://127.0.0.1:6379", help="a throwaway one when none answers")
    sub.add_argument("--checks", type=int, default=200_000)
    sub.add_argument("--clients", type=int, default=100_000)
    sub.add_argument("--rounds", type=int, default=5)
    for name, run in (("memory", memory), ("end", end)):
        sub = way(name, run)
        sub.add_argument("--redis-server", default=shutil.which("redis-server"), help="the server to start")
    sub.add_argument("--in-flight", default="100,1000,10000,100000")
    sub.add_argument("--ends", type=int, default=1000)
    sub = ways.choices["memory"]
    sub.add_argument("--clients", type=int, default=1_000_000)
    sub.add_argument("--batch", type=int, default=5000, help="checks per round trip")
    sub.add_argument("--mode", choices=["seed", "inflight"], default="seed")
    sub.add_argument("--costed", action="store_true", help="every document costs 2.5")
    sub.add_argument("--maxmemory-policy", help="e.g. allkeys-lru (sets maxmemory 16gb too)")
    sub = way("gate", gate)
    sub.add_argument("--docs", type=int, default=2000)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
