"""What the worker's gate adds per document of a limited client, against a plain PING.

A client without limits costs the gate nothing: one dictionary lookup, no round trip (and
publishers never read limits).  A limited client's document costs the worker, on a
throwaway Redis so nothing else runs there:

- ``admit``: the gate's script when the document is received, admitted under its cap;
- ``end``: the script when it ends (its slot freed, nothing held to release);
- ``hold``: the script when it is counted held (its message goes to the broker's holding
  queue: a broker publish, not counted here);
- ``end + release``: an end that releases a held document: the end, the take that reserves
  its slot and the mark that it was sent (the holding queue's get, publish and ack are
  broker calls, not counted here);

each as wall time per call from this process, next to a ``PING`` on the same connection
as the unit (round-trip time dominates both).

    python bench/gate_overhead.py [--docs 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from bench.provenance import code_version  # noqa: E402
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


class Queue:
    """A holding queue in memory: the broker's part of a release is not measured here."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = list(reversed(ids))

    def take(self) -> Document | None:
        return Document(self.ids.pop()) if self.ids else None


class Document:
    units = ONE

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id

    def send(self) -> None:
        pass

    def drop(self) -> None:
        pass

    def put_back(self) -> None:
        raise AssertionError("the bench's releases are never blocked")


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
        ids = [f"d{i}" for i in range(args.docs)]
        ping = per_call(args.docs, lambda i: client.ping())
        admit = per_call(args.docs, lambda i: gate.admit("roomy", f"{i}-{uuid.uuid4()}", roomy, ONE))
        gate.end("roomy", "", roomy)
        client.delete(*[k for k in client.scan_iter("gate-bench:*")])
        for i in ids:
            gate.admit("ends", i, roomy, ONE)
        end = per_call(1, lambda _: [gate.end("ends", i, roomy) for i in ids]) / args.docs

        def hold_all() -> None:
            stale = list(client.scan_iter("gate-bench:{tight}*"))
            if stale:
                client.delete(*stale)
            gate.admit("tight", "runner", tight, ONE)
            for i in ids:
                gate.admit("tight", i, tight, ONE)

        hold = per_call(1, lambda _: hold_all()) / args.docs
        queue = Queue(ids)

        def end_and_release(task_id: str) -> None:
            gate.release("tight", tight, gate.end("tight", task_id, tight), queue, 3_900_000, most=1)

        # Each end frees the one slot and releases the next held document.
        release = per_call(1, lambda _: [end_and_release(i) for i in ["runner", *ids[:-1]]]) / args.docs
    finally:
        client.close()
        server.stop()
    rows = [
        ("PING (the unit)", ping),
        ("admit (under the cap)", admit),
        ("end", end),
        ("hold (counted held)", hold),
        ("end + release", release),
    ]
    print(f"priority-router gate overhead, {args.docs} documents, {code_version()}")
    print(f"{'call':<28}{'µs per call':>14}{'x PING':>10}")
    for name, us in rows:
        print(f"{name:<28}{us:>14.1f}{us / ping:>10.2f}")


if __name__ == "__main__":
    main()
