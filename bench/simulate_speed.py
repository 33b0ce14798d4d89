"""Speed: how long ``simulate`` takes on a large trace, policy by policy, on one core.

Writes a CSV trace of ``--documents`` documents from ``--clients`` clients (every client
sends at least one; the rest pick clients by a Zipf law, so a few clients send most;
``--burst-share`` of the documents come in bursts of 200-2,000 from one client at one
instant), arriving as a Poisson stream that keeps ``--workers`` slots about
``--load`` busy, with lognormal lengths of mean 1 s (and, with ``--cost-column``, a
``cost`` column of lognormal costs of mean 5, to the thousandth).  Then, pinned to one
CPU, it loads the trace as ``simulate`` does, counts costs as ``--cost`` says and runs
every policy, timing the event loop and the metrics of each.

    python bench/simulate_speed.py                       # 1,000,000 documents, 10,000 clients
    python bench/simulate_speed.py --documents 100000    # a quick look
    python bench/simulate_speed.py --cost-column         # documents with costs
    python bench/simulate_speed.py --cost duration       # counted by their seconds
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from priority_router.config import RouterConfig  # noqa: E402
from priority_router.simulation import EVERY_POLICY, build, load_csv, run, summarize  # noqa: E402
from priority_router.simulation.trace import BASES, counted_by  # noqa: E402


def write_trace(path: Path, args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    weights = list(itertools.accumulate(1 / (k + 1) ** 1.1 for k in range(args.clients)))
    sigma = 0.8
    mu = -sigma * sigma / 2  # lognormal with mean 1 s

    def zipf_client() -> int:
        return bisect.bisect(weights, rng.random() * weights[-1])

    clients = list(range(args.clients))  # each client at least once, at a random turn
    rest = args.documents - args.clients
    bursts: list[int] = []
    burst_docs = int(rest * args.burst_share)
    while sum(bursts) < burst_docs:
        bursts.append(min(rng.randint(200, 2000), burst_docs - sum(bursts)))
    singles = clients + [zipf_client() for _ in range(rest - burst_docs)]
    events: list[list[int]] = [[c] for c in singles] + [[zipf_client()] * size for size in bursts]
    rng.shuffle(events)
    rate = args.load * args.workers * len(events) / args.documents  # events/s for that load
    t = 0.0
    costed = args.cost_column
    with open(path, "w") as f:
        f.write("timestamp,client_id,duration,cost\n" if costed else "timestamp,client_id,duration\n")
        for event in events:
            t += rng.expovariate(rate)
            for client in event:
                line = f"{t:.6f},client{client},{rng.lognormvariate(mu, sigma):.6f}"
                f.write(f"{line},{5 * rng.lognormvariate(mu, sigma):.3f}\n" if costed else f"{line}\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=32, help="worker slots simulated")
    parser.add_argument("--load", type=float, default=0.98, help="share of the slots' capacity asked for")
    parser.add_argument("--burst-share", type=float, default=0.2, help="share of documents sent in bursts")
    parser.add_argument("--max-wait", type=float, default=60.0, help="seconds, for the +max_wait policies")
    parser.add_argument("--policies", default=",".join(EVERY_POLICY))
    parser.add_argument("--cost-column", action="store_true", help="write a cost column")
    parser.add_argument("--cost", choices=BASES, default=BASES[0], help="what a document counts for")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cpu", type=int, help="the CPU to pin to [the first one this process may use]")
    args = parser.parse_args()
    if args.documents < args.clients:
        parser.error("--documents must be at least --clients (every client sends one)")
    if hasattr(os, "sched_setaffinity"):
        cpu = args.cpu if args.cpu is not None else min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        where = f"pinned to CPU {cpu}"
    else:
        where = "not pinned (no sched_setaffinity here)"
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    config = RouterConfig(max_wait=args.max_wait)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.csv"
        began = time.perf_counter()
        write_trace(path, args)
        written = time.perf_counter() - began
        size = path.stat().st_size
        began = time.perf_counter()
        trace = counted_by(load_csv(path), args.cost)
        loaded = time.perf_counter() - began
    print(
        f"{len(trace):,} documents, {len(trace.clients):,} clients, {args.workers} workers, "
        f"load {args.load:g}, max_wait {args.max_wait:g} s, cost {args.cost}"
        f"{' (a cost column)' if args.cost_column else ''}; {where}; Python {sys.version.split()[0]}"
    )
    print(f"trace: {size / 1e6:.0f} MB written in {written:.1f} s (not counted), loaded in {loaded:.2f} s")
    print("| policy | event loop | metrics | total | documents/s | makespan | longest wait |")
    print("|---|---|---|---|---|---|---|")
    total = loaded
    for name in policies:
        began = time.perf_counter()
        schedule = run(trace, build(name, config), args.workers)
        looped = time.perf_counter() - began
        outcome = summarize(name, trace, schedule)
        measured = time.perf_counter() - began - looped
        total += looped + measured
        print(
            f"| {name} | {looped:.2f} s | {measured:.2f} s | {looped + measured:.2f} s | "
            f"{len(trace) / (looped + measured):,.0f} | {outcome.makespan / 3600:.2f} h | "
            f"{max(outcome.waits) / 60:.1f} min |"
        )
    print(
        f"all {len(policies)} policies and the loading: {total:.1f} s on one core "
        f"({'under' if total < 60 else 'OVER'} 60 s)"
    )


if __name__ == "__main__":
    main()
