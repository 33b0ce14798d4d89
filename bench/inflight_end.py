"""What ending a document costs Redis in the inflight mode, by how much its client has in flight.

The worker's end is ``MULTI; LREM key -1 m; PEXPIRE key ms; EXEC``.  ``LREM -1`` walks
the client's list from its oldest entry, so its cost depends on where the entry is.  For
a client with ``N`` documents in flight, three ways of ending ``--ends`` of them, each on
a fresh list built by the router's own publish:

- ``oldest first``: in the order they were published, as a queue serves one client at
  one priority (the entry is the first one looked at);
- ``newest first``: the reverse (each end walks past every older document);
- ``not there``: an end of a document that is not in the list, as when an end event is
  seen twice (the whole list is read).

The figure is the server's own time per ``LREM`` (``INFO commandstats``, microseconds),
next to a ``PEXPIRE`` (the cheapest command of the same transaction) as the unit.  The
server is a throwaway one, so nothing else runs on it.

    python bench/inflight_end.py [--in-flight 100,1000,10000,100000] [--ends 1000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import uuid
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from bench.provenance import code_version  # noqa: E402
from priority_router.store.inflight import InflightCounter  # noqa: E402
from workers.local_redis import start_embedded_redis  # noqa: E402

PREFIX = "inflight-end:"


def server_usec(client: redis.Redis, command: str) -> tuple[int, float]:
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0)), float(stats.get("usec", 0))


def measure(client: redis.Redis, in_flight: int, ends: int, order: str) -> float:
    """Server µs per ``LREM`` over ``ends`` ends of a client with ``in_flight`` documents."""
    counter = InflightCounter(client, PREFIX, 1500)
    client_id = f"c-{order}-{in_flight}"
    ids = [str(uuid.uuid4()) for _ in range(in_flight)]
    for task_id in ids:
        counter.record(client_id, task_id)
    targets = {
        "oldest first": ids[:ends],
        "newest first": ids[::-1][:ends],
        "not there": [str(uuid.uuid4()) for _ in range(ends)],
    }[order]
    before = server_usec(client, "lrem")
    # ``end`` returns the units a document was counted with (None when not in flight).
    ended = sum(counter.end(client_id, t) is not None for t in targets)
    after = server_usec(client, "lrem")
    expected = 0 if order == "not there" else len(targets)
    if ended != expected:
        raise RuntimeError(f"{order}: {ended} ends took effect, expected {expected}")
    counter.clear(client_id)
    return (after[1] - before[1]) / max(1, after[0] - before[0])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--in-flight", default="100,1000,10000,100000")
    parser.add_argument("--ends", type=int, default=1000)
    parser.add_argument("--redis-server", default=shutil.which("redis-server"), help="the server to start")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [int(n) for n in args.in_flight.split(",")]

    server = start_embedded_redis(executable=args.redis_server)
    client = redis.Redis.from_url(server.url)
    try:
        version = client.info("server")["redis_version"]
        client.config_resetstat()
        client.set("unit", 1)
        for _ in range(2000):
            client.pexpire("unit", 100_000)
        calls, usec = server_usec(client, "pexpire")
        unit = usec / calls
        rows = []
        for size in sizes:
            ends = min(args.ends, size)
            row = {"in_flight": size, "ends": ends}
            for order in ("oldest first", "newest first", "not there"):
                row[order] = measure(client, size, ends, order)
            rows.append(row)
    finally:
        client.close()
        server.stop()

    if args.json:
        print(
            json.dumps({"redis_version": version, "code": code_version(), "pexpire_us": unit, "rows": rows})
        )
        return
    print(f"Redis {version}, server µs per LREM (PEXPIRE: {unit:.2f} µs), {code_version()}")
    print("| documents in flight | ends | oldest first | newest first | not there |")
    print("|---|---|---|---|---|")
    for r in rows:
        cells = " | ".join(
            f"{r[o]:.2f} µs ({r[o] / unit:.1f}x)" for o in ("oldest first", "newest first", "not there")
        )
        print(f"| {r['in_flight']:,} | {r['ends']:,} | {cells} |")


if __name__ == "__main__":
    main()
