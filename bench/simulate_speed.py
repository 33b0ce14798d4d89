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
    python bench/simulate_speed.py --tune [--mode inflight] [--one-process]   # simulate --tune

``--tune`` times ``simulate TRACE --tune`` instead, on a day's busy hours (``tune_speed()``).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from priority_router.config import RouterConfig  # noqa: E402
from priority_router.ops.simulate_tune import as_document  # noqa: E402
from priority_router.simulation import EVERY_POLICY, build, load_csv, run, summarize  # noqa: E402
from priority_router.simulation.fit import tune  # noqa: E402
from priority_router.simulation.trace import BASES, counted_by  # noqa: E402
from priority_router.simulation.tune import Case  # noqa: E402


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


def write_day(path: Path, documents: int, hours: float, seed: int) -> int:
    """Write the trace; returns its number of clients."""
    rng = random.Random(seed)
    span = hours * 3600
    sigma = 0.6
    mu = math.log(2.0) - sigma * sigma / 2  # lognormal lengths of mean 2 s

    def length() -> float:
        return round(rng.lognormvariate(mu, sigma), 3)

    rows: list[tuple[float, str, float]] = []
    for n, (share, at) in enumerate([(0.20, 0.25 * span), (0.12, 0.25 * span + 300)]):
        rows += [(at + i * 0.002, f"giant{n}", length()) for i in range(int(share * documents))]
    for c in range(100):
        size = round(math.exp(rng.uniform(math.log(25), math.log(1200))) * documents / 100_000)
        parts = rng.randint(1, 3)
        for p in range(parts):
            at = rng.uniform(0, span)
            burst = size // parts + (1 if p < size % parts else 0)
            rows += [(at + i * 0.002, f"medium{c:03d}", length()) for i in range(burst)]
    light = 0
    while len(rows) < documents:
        for _ in range(min(rng.randint(1, 12), documents - len(rows))):
            rows.append((rng.uniform(0, span), f"light{light:05d}", length()))
        light += 1
    rows.sort()
    with open(path, "w") as f:
        f.write("timestamp,client_id,duration\n")
        for at, client, seconds in rows:
            f.write(f"{at:.3f},{client},{seconds}\n")
    return 2 + 100 + light


def timed(args: list[str]) -> tuple[float, str]:
    """Wall seconds of ``python -m priority_router ARGS``, and what it printed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIORITY_ROUTER_")}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "priority_router", *args], env=env, cwd=ROOT, capture_output=True, text=True
    )
    took = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"{' '.join(args)} failed:\n{done.stderr}")
    return took, done.stdout


def tune_speed(args: argparse.Namespace) -> None:
    """Speed of ``priority-router simulate TRACE --tune`` on a day's busy hours of a document service.

    Writes a CSV trace of ``--documents`` documents (100,000) over ``--hours`` hours (4): two
    giants (20% and 12% of the documents, a bulk import each, the second 5 minutes after the
    first, at a quarter of the span), 100 medium clients (25 to 1,200 documents each,
    log-uniform, in one to three bursts at random times) and thousands of light clients (1 to 12
    documents each, at random times) for the rest; documents of lognormal length, mean 2 s.
    Then it runs, as a user would (``python -m priority_router``, a process each, wall time):

    - one replay of the trace under the router's policy (``simulate TRACE --policies seed``):
      what one table costs;
    - ``simulate TRACE --tune``: the references, and every table of the family, in one
      process per CPU;
    - with ``--one-process``, the same search in this process alone (``fit.tune(jobs=1)``,
      the trace already loaded): what the processes save.

        python bench/simulate_speed.py --tune                      # 100,000 documents on 32 slots
        python bench/simulate_speed.py --tune --mode inflight
        python bench/simulate_speed.py --tune --one-process        # and the search in one process
        python bench/simulate_speed.py --tune --documents 20000    # a quick look
    """
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.csv"
        clients = write_day(trace, args.documents, args.hours, args.seed)
        size = f"{args.documents:,} documents from {clients:,} clients over {args.hours:g} h"
        print(f"{size}, {args.workers} slots")
        common = ["simulate", str(trace), "--workers", str(args.workers), "--json"]
        one, _ = timed([*common, "--policies", args.mode])
        print(f"  one replay (simulate --policies {args.mode}):  {one:6.1f} s")
        tuning, out = timed([*common, "--tune", "--mode", args.mode])
        found = json.loads(out)
        print(f"  simulate --tune --mode {args.mode}:            {tuning:6.1f} s")
        groups = found["policies"]["fifo"]["groups"]
        print(
            f"  {found['searched']} tables searched; clients light {groups['light']['clients']:,}, "
            f"medium {groups['medium']['clients']}, heavy {groups['heavy']['clients']}; "
            f"{os.cpu_count()} CPUs"
        )
        for name, policy in found["policies"].items():
            score = "" if policy["score"] is None else f"  score {policy['score']:.2f} ({policy['bound']})"
            medium = policy["groups"]["medium"]["worst_p95"]
            print(f"    {name:8} medium worst p95 {medium:8.1f} s{score}")
        print(f"  recommended: {found['recommended']['policy']}: {found['recommended']['why']}")
        print(f"    {found['recommended']['settings']['option']}")
        if args.one_process:
            case = Case("trace", load_csv(trace), args.workers, args.mode)
            started = time.perf_counter()
            alone = tune(case, jobs=1)
            took = time.perf_counter() - started
            same = as_document(alone)["policies"] == found["policies"]
            shown = "the same figures" if same else "DIFFERENT figures"
            print(f"  the search in one process (loaded):      {took:6.1f} s, {shown}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--documents", type=int, help="1,000,000; with --tune 100,000")
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=32, help="worker slots simulated")
    parser.add_argument("--load", type=float, default=0.98, help="share of the slots' capacity asked for")
    parser.add_argument("--burst-share", type=float, default=0.2, help="share of documents sent in bursts")
    parser.add_argument("--max-wait", type=float, default=60.0, help="seconds, for the +max_wait policies")
    parser.add_argument("--policies", default=",".join(EVERY_POLICY))
    parser.add_argument("--cost-column", action="store_true", help="write a cost column")
    parser.add_argument("--cost", choices=BASES, default=BASES[0], help="what a document counts for")
    parser.add_argument("--seed", type=int, help="1; with --tune 7")
    parser.add_argument("--tune", action="store_true", help="time simulate --tune on a day's busy hours")
    parser.add_argument("--hours", type=float, default=4.0, help="--tune: the hours the trace spans")
    parser.add_argument("--mode", choices=("seed", "inflight"), default="seed", help="--tune: the mode tuned")
    parser.add_argument("--one-process", action="store_true", help="--tune: also the search in one process")
    parser.add_argument("--cpu", type=int, help="the CPU to pin to [the first one this process may use]")
    args = parser.parse_args()
    args.documents = args.documents or (100_000 if args.tune else 1_000_000)
    args.seed = (7 if args.tune else 1) if args.seed is None else args.seed
    if args.tune:
        tune_speed(args)
        return
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
