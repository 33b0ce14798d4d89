"""What no threshold table can do: the wide table's bound on ``mixed-sizes`` counted in seconds.

The wide table is held to three bounds against per-client round robin (``drr``) in the
simulator (``priority_router/simulation/tune.py``): medium clients within 1.1x of their
``drr`` p95 (or 2 s), every client within 1.5x (or 2 s), light clients within 10% of the
scheme's table.  On the built-in ``mixed-sizes`` workload (4 slots, ten clients' invoices of
about 1 s and one client's scans of about 30 s) counted in seconds, a client's invoices are
checked at counts 0 to 9 and the scans at 0, about 30, 60 and on.  The first 4 scans start
at once whatever the table (nothing else waits), so what a table decides on this trace is
how its limits split the counts 0..9, and whether one falls between the invoices and the
later scans.  This script judges every such table: each subset of the limits 0..9 and 20 as
its shallow limits, the rest deep (100, 200, ...), in both counting modes; then, for the
best, 200 random draws of its deep limits, to show they change nothing.  A best score above
1.0 means no table meets the bounds on that trace.

The client that binds is a light one on the every-client bound: ``drr`` serves one client's
ten invoices in one turn (its quantum is the largest cost, a scan), where a table treats
every client's n-th invoice alike.

    python bench/wide_limits.py                 # seed 7 (the workloads' default), a few seconds
    python bench/wide_limits.py --seeds 7,11,12
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from itertools import combinations
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from priority_router.simulation.trace import counted_by  # noqa: E402
from priority_router.simulation.tune import Baseline, Case, baseline, judge, table_of  # noqa: E402
from priority_router.simulation.workloads import WORKLOADS  # noqa: E402
from priority_router.thresholds import WIDE_THRESHOLDS, rows_text  # noqa: E402

SHALLOW = [*range(10), 20]
DEEP = 100


def worst(bases: list[Baseline], limits: list[int]) -> float:
    table = table_of(sorted(limits))
    return max(judge(base, table).score for base in bases)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="7")
    args = parser.parse_args()
    for seed in (int(s) for s in args.seeds.split(",")):
        started = time.perf_counter()
        trace = counted_by(WORKLOADS["mixed-sizes"](seed).trace(), "duration")
        modes = ("seed", "inflight")
        bases = [baseline(Case(f"mixed-sizes seed {seed}, {mode}", trace, 4, mode)) for mode in modes]
        scored = []
        for k in range(9):
            for shallow in combinations(SHALLOW, k):
                limits = [*shallow, *(DEEP * (j + 1) for j in range(8 - k))]
                scored.append((worst(bases, limits), sorted(limits)))
        scored.sort()
        best, limits = scored[0]
        rng = random.Random(seed)
        shallow = [x for x in limits if x < DEEP]
        redrawn = min(
            worst(bases, [*shallow, *rng.sample(range(DEEP, 3000), 8 - len(shallow))]) for _ in range(200)
        )
        print(
            f"seed {seed}: {len(scored)} tables, both modes; best score {best:.4f} "
            f"({rows_text(table_of(limits))}); with 200 redrawn deep limits at best {redrawn:.4f}; "
            f"wide {max(judge(b, WIDE_THRESHOLDS).score for b in bases):.4f} "
            f"({time.perf_counter() - started:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
