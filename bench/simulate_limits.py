"""Per-client caps in the simulator: one client's long documents next to light clients.

The ``backlog`` trace, on ``--workers`` slots (4): one client (``heavy``) dumps ``--heavy``
documents of 20-40 s at t=0 and ten light clients (``light00``...) each send a document of
1-3 s every 60 s, 6 s apart, for ``--minutes`` minutes.  (The built-in ``slow-neighbour``
workload needs no script: ``priority-router simulate --workload slow-neighbour --policies
fifo,seed,inflight,drr --tier heavy=max_in_flight=3 --json``.)

It is run under fifo, seed, inflight and drr without limits, with the heavy client at
``max_in_flight=3`` and at ``max_in_flight=3,borrow``; the table shows the light clients'
worst p95 and longest wait, the heavy client's longest wait and the makespan.
``--write DIR`` also writes the trace as a CSV file, for ``priority-router simulate``:

    python bench/simulate_limits.py
    python bench/simulate_limits.py --write /tmp/limits
    priority-router simulate /tmp/limits/backlog.csv --tier heavy=max_in_flight=3
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from priority_router.config import RouterConfig  # noqa: E402
from priority_router.simulation import Tiers, Trace, TraceBuilder, compare  # noqa: E402
from priority_router.simulation.tiers import parse_tier  # noqa: E402

POLICIES = ("fifo", "seed", "inflight", "drr")
SETTINGS = ("none", "max_in_flight=3", "max_in_flight=3,borrow")


def backlog(heavy: int, minutes: int, seed: int = 7) -> Trace:
    """The heavy client's backlog at 0, and ten light clients each sending every 60 s."""
    rng = random.Random(seed)
    docs = [(0.0, "heavy", "heavy", rng.uniform(20, 40)) for _ in range(heavy)]
    docs += [
        (60.0 * k + 6.0 * c, f"light{c:02d}", "light", rng.uniform(1, 3))
        for k in range(minutes)
        for c in range(10)
    ]
    builder = TraceBuilder()
    for at, client, group, seconds in sorted(docs, key=lambda d: d[0]):
        builder.add(client, group, at, seconds)
    return builder.build()


def write_csv(trace: Trace, path: Path) -> None:
    with open(path, "w") as f:
        f.write("timestamp,client_id,duration\n")
        for c, at, seconds in zip(trace.client, trace.at, trace.duration, strict=True):
            f.write(f"{at:.3f},{trace.clients[c]},{seconds:.3f}\n")


def table(name: str, trace: Trace, workers: int) -> None:
    print(f"\n{name}: {len(trace)} documents, {workers} workers\n")
    print("| heavy's limits | policy | light: worst p95 | light: longest | heavy: longest | makespan |")
    print("|---|---|---|---|---|---|")
    for setting in SETTINGS:
        tiers = None if setting == "none" else Tiers({"heavy": parse_tier(setting)})
        outcomes = compare(trace, POLICIES, RouterConfig(), workers, tiers=tiers)
        for policy, o in outcomes.items():
            light = [w for c, w in o.per_client.items() if c != "heavy"]
            print(
                f"| {setting} | {policy} | {max(w.p95_wait for w in light):.1f} s "
                f"| {max(w.max_wait for w in light):.1f} s | {o.per_client['heavy'].max_wait:.1f} s "
                f"| {o.makespan:.1f} s |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--heavy", type=int, default=100, help="the backlog's documents")
    parser.add_argument("--minutes", type=int, default=15, help="minutes the light clients send")
    parser.add_argument("--write", type=Path, metavar="DIR", help="also write the traces as CSV here")
    args = parser.parse_args()
    traces = {"backlog": backlog(args.heavy, args.minutes)}
    if args.write is not None:
        args.write.mkdir(parents=True, exist_ok=True)
        for name, trace in traces.items():
            write_csv(trace, args.write / f"{name}.csv")
    for name, trace in traces.items():
        table(name, trace, args.workers)


if __name__ == "__main__":
    main()
