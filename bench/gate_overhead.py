"""What the worker's gate adds per document of a limited client, against a plain PING.

A client without limits costs the gate nothing: one dictionary lookup, no round trip (and
publishers never read limits).  A limited client's document costs the worker, on a
throwaway Redis so nothing else runs there:

- ``admit``: the gate's script when the document is received, admitted under its cap;
- ``end``: the script when it ends (its slot freed, nothing held to release);
- ``hold``: the script when it is held, with its message stored (``pack``: the message as
  JSON, measured apart, in the worker's own process);
- ``end + release``: an end that releases a held document (its republish is a broker
  publish, not counted here);

each as wall time per call from this process, next to a ``PING`` on the same connection
as the unit (round-trip time dominates both).

    python bench/gate_overhead.py [--docs 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bench.provenance import code_version  # noqa: E402
from priority_router.integration.redeliver import pack  # noqa: E402
from priority_router.limits import Limits  # noqa: E402
from priority_router.store.gate import GateStore  # noqa: E402
from workers.local_redis import start_embedded_redis  # noqa: E402

ONE = 1000


def per_call(calls: int, run: Callable[[int], object]) -> float:
    """Median µs per call over five rounds of ``calls`` calls."""
    rounds = []
    for _ in range(5):
        started = time.perf_counter()
        for i in range(calls):
            run(i)
        rounds.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(rounds)


def a_message() -> SimpleNamespace:
    """A Celery protocol 2 message as kombu delivers it, of a typical size."""
    task_id = str(uuid.uuid4())
    headers = {
        "lang": "py",
        "task": "workers.process_document",
        "id": task_id,
        "root_id": task_id,
        "retries": 0,
        "timelimit": [None, None],
        "argsrepr": "('acme', 'd-1', 3)",
        "kwargsrepr": "{'priority_router_client': 'acme', 'priority_router_priority': 9}",
        "client_id": "acme",
        "priority_router_priority": 9,
        "priority_router_pending": -40,
        "priority_router_reason": "counted",
        "priority_router_published_at": time.time(),
    }
    return SimpleNamespace(
        body=json.dumps([["acme", "d-1", 3], {}, {"callbacks": None, "errbacks": None}]).encode(),
        content_type="application/json",
        content_encoding="utf-8",
        headers=headers,
        properties={"priority": 0, "correlation_id": task_id, "delivery_mode": 2},
        delivery_info={"exchange": "", "routing_key": "documents"},
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=2000)
    args = parser.parse_args()
    server = start_embedded_redis()
    client = redis.Redis.from_url(server.url)
    try:
        gate = GateStore(client, "gate-bench:")
        roomy, tight = Limits(max_in_flight=1_000_000), Limits(max_in_flight=1)
        message = a_message()
        packed = pack(message)
        ids = [f"d{i}" for i in range(args.docs)]
        ping = per_call(args.docs, lambda i: client.ping())
        admit = per_call(args.docs, lambda i: gate.admit("roomy", f"{i}-{uuid.uuid4()}", roomy, ONE, packed))
        gate.end("roomy", "", roomy)
        client.delete(*[k for k in client.scan_iter("gate-bench:*")])
        for i in ids:
            gate.admit("ends", i, roomy, ONE, packed)
        end = per_call(1, lambda _: [gate.end("ends", i, roomy) for i in ids]) / args.docs
        gate.admit("tight", "runner", tight, ONE, packed)
        hold = per_call(1, lambda _: [gate.admit("tight", i, tight, ONE, packed) for i in ids]) / args.docs
        # Each end frees the one slot and releases the next held document.
        release = (
            per_call(1, lambda _: [gate.end("tight", i, tight) for i in ["runner", *ids[:-1]]]) / args.docs
        )
        pack_us = per_call(args.docs, lambda i: pack(message))
    finally:
        client.close()
        server.stop()
    rows = [
        ("PING (the unit)", ping),
        ("admit (under the cap)", admit),
        ("end", end),
        ("hold (message stored)", hold),
        ("end + release", release),
        ("pack the message (no I/O)", pack_us),
    ]
    print(f"priority-router gate overhead, {args.docs} documents, {code_version()}")
    print(f"message stored: {len(packed)} bytes")
    print(f"{'call':<28}{'µs per call':>14}{'x PING':>10}")
    for name, us in rows:
        print(f"{name:<28}{us:>14.1f}{us / ping:>10.2f}")


if __name__ == "__main__":
    main()
