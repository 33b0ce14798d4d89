"""``bench/costs.py``'s trace in the simulator: big scans and small invoices, by document and by cost.

The same documents as the real-worker benchmark, by default the issue's trace scaled down
ten times: one client sends ``--scans`` scans of ``--scan-seconds`` at t=0, and
``--clients`` clients send ``--invoices`` invoices of ``--invoice-seconds`` each at t=0.1 s,
on ``--concurrency`` slots (``MixedSizes`` with exact lengths).  It prints the same table
as ``bench/costs.py`` for FIFO and the router by document and by seconds, so the two can
be read side by side; ``--overhead`` is the seconds each slot spends on a document before
it starts (``simulate --overhead``).

    python bench/simulate_costs.py                       # the scaled trace, as bench/costs.py
    python bench/simulate_costs.py --scan-seconds 30 --invoice-seconds 1 --at 1   # the issue's
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from priority_router.config import RouterConfig  # noqa: E402
from priority_router.simulation import MixedSizes, compare  # noqa: E402

#: bench/costs.py's runs -> (the simulator's policy, what a document costs).
RUNS = {
    "plain Celery": ("fifo", "column"),
    "router, every document 1": (None, "column"),
    "router, cost = seconds": (None, "duration"),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scans", type=int, default=20)
    parser.add_argument("--scan-seconds", type=float, default=3.0)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--invoices", type=int, default=10, help="documents per invoice client")
    parser.add_argument("--invoice-seconds", type=float, default=0.1)
    parser.add_argument("--at", type=float, default=0.1, help="seconds after the scans the invoices go out")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--mode", default="seed", choices=["seed", "inflight"])
    parser.add_argument("--overhead", type=float, default=0.0)
    args = parser.parse_args()
    workload = MixedSizes(
        heavy=args.scans,
        heavy_seconds=args.scan_seconds,
        light_clients=args.clients,
        light_docs=args.invoices,
        light_seconds=args.invoice_seconds,
        light_at=args.at,
        jitter=0.0,
    )
    trace = workload.trace()
    print(f"| simulated, {args.mode} | invoices: worst p95 wait | median p95 | scans: p95 wait | makespan |")
    print("|---|---|---|---|---|")
    for name, (policy, cost) in RUNS.items():
        chosen = policy or args.mode
        outcome = compare(
            trace, [chosen], RouterConfig(), args.concurrency, overhead=args.overhead, cost=cost
        )[chosen]
        invoices = [w.p95_wait for c, w in outcome.per_client.items() if c.startswith("invoices")]
        print(
            f"| {name} | {max(invoices):.2f} s | {statistics.median(invoices):.2f} s | "
            f"{outcome.per_client['scans'].p95_wait:.2f} s | {outcome.makespan:.2f} s |"
        )


if __name__ == "__main__":
    main()
