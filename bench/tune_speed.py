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

    python bench/tune_speed.py                      # 100,000 documents on 32 slots
    python bench/tune_speed.py --mode inflight
    python bench/tune_speed.py --one-process        # and the search in one process
    python bench/tune_speed.py --documents 20000    # a quick look
"""

from __future__ import annotations

import argparse
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

from priority_router.ops.simulate_tune import as_document  # noqa: E402
from priority_router.simulation.fit import tune  # noqa: E402
from priority_router.simulation.trace import load_csv  # noqa: E402
from priority_router.simulation.tune import Case  # noqa: E402


def write_trace(path: Path, documents: int, hours: float, seed: int) -> int:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--hours", type=float, default=4.0)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--mode", choices=("seed", "inflight"), default="seed")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--one-process", action="store_true", help="also time the search in one process")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.csv"
        clients = write_trace(trace, args.documents, args.hours, args.seed)
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


if __name__ == "__main__":
    main()
