"""Fairness on a real worker: light clients' waits beside heavy clients' backlogs, each
configuration against plain Celery (or the strict router) in the same run, in turn.

    python bench/fairness.py [--repeat 3] [--broker amqp://...] [--pool prefork]   # noisy neighbour
    python bench/fairness.py --simulate [--repeat 3]   # ... and the simulator replaying each run
    python bench/fairness.py --workload starvation [--repeat 2]   # the strict router vs max_wait=3
    python bench/fairness.py --workload modes [--repeat 3]        # the counting modes, two workloads
    python bench/fairness.py --workload giants [--repeat 3]       # giants: the scheme's table and wide

Workloads (``workers/workload.py``, the simulator's ``--workload`` definitions):

- ``noisy`` (``noisy-neighbour``): one client dumps ``--heavy`` documents (160); once they are
  out, ``--light-clients`` (12) send ``--light-docs`` (2) each over ``--light-spread`` s (1);
  configurations ``fifo`` (plain Celery, its defaults) and ``seed`` (the router);
- ``starvation``: one client sends ``--heavy`` (25) at once, then a new light client sends one
  document every ``1 / --rate`` s for ``--stream`` s, more than ``--threads`` (2) slots can
  run; ``seed`` (strict) against ``seed+max_wait`` (``--max-wait`` 3);
- ``steady+burst``: a steady client sends ``--steady`` (30) one at a time, each when the previous
  ended; before its ``--burst-after``+1-th another dumps ``--burst`` (150);
- ``heavy-mix``: clients dump ``--heavy`` (120 60 30) documents ``--heavy-gap`` s (0.5) apart;
  8 light clients send 2 each over 2.5 s;
- ``modes``: both of the last two, under fifo, seed, seed+max_wait, inflight and
  inflight+max_wait (``--max-wait`` 1);
- ``giants`` (the simulator's ``several-giants`` scaled to one worker): giants dump
  ``--heavy`` (600 400) documents ``--heavy-gap`` s (0.25) apart; medium clients dump
  ``--medium`` (60 50 40 30 25) from 0.1 s, ``--medium-gap`` s (1) apart; 20 light clients
  send 3 each over 30 s; documents of 50-150 ms (``--doc-ms 100``); fifo, seed (the scheme's
  table) and wide (``PRIORITY_ROUTER_THRESHOLDS=wide``), each replayed in the simulator, and
  waits by group (light: at most 20 documents; medium: at most a tenth of the largest giant).

A real worker (``--pool``, ``--threads``) runs documents holding a slot ``--doc-ms`` (50) on
average, ``--jitter`` (0.5) spreading them evenly around it, the same seeded lengths in every
run.  A wait runs from the publisher's ``send_task`` returning to the worker starting the
document.  Jain is over the clients' slowdowns, mean(wait + service) / mean(service).

``--simulate`` (``noisy``; always on for ``giants``) replays each run in the simulator twice: the run's
own trace (publish times as recorded, slot times as the worker reported, the run's median
dispatch gap as the overhead) and the workload as defined (``simulate --workload``).
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from priority_router.config import RouterConfig  # noqa: E402
from priority_router.simulation import Trace, TraceBuilder, build, run  # noqa: E402
from priority_router.thresholds import WIDE_THRESHOLDS  # noqa: E402
from workers.app import create_app  # noqa: E402
from workers.local_redis import RedisDatabases, redis_or_embedded  # noqa: E402
from workers.services import running_worker  # noqa: E402
from workers.workload import (  # noqa: E402
    Giants,
    HeavyMix,
    NoisyNeighbour,
    SteadyBurst,
    jain,
    p95,
    publish,
    publish_steady_burst,
    publish_timed,
    slowdown,
)

#: name -> (router on, mode, uses max_wait, threshold table)
CONFIGS = {
    "fifo": (False, "seed", False, "default"),
    "seed": (True, "seed", False, "default"),
    "seed+max_wait": (True, "seed", True, "default"),
    "inflight": (True, "inflight", False, "default"),
    "inflight+max_wait": (True, "inflight", True, "default"),
    "wide": (True, "seed", False, "wide"),
}
#: --workload -> (the workloads it runs, its default configurations and options).
WORKLOADS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "noisy": (("noisy",), {"configs": "fifo,seed", "heavy": [160], "light_clients": 12, "light_spread": 1.0}),
    "starvation": (
        ("starvation",),
        {"configs": "seed,seed+max_wait", "heavy": [25], "threads": 2, "max_wait": 3.0},
    ),
    "steady+burst": (("steady+burst",), {}),
    "heavy-mix": (("heavy-mix",), {}),
    "modes": (("steady+burst", "heavy-mix"), {}),
    "giants": (
        ("giants",),
        {"configs": "fifo,seed,wide", "heavy": [600, 400], "heavy_gap": 0.25, "doc_ms": 100},
    ),
}
WORKLOADS["giants"][1].update(light_clients=20, light_docs=3, light_spread=30.0, simulate=True)
DEFAULTS = {"configs": ",".join(list(CONFIGS)[:5]), "heavy": [120, 60, 30], "light_clients": 8}
DEFAULTS |= {
    "light_spread": 2.5,
    "threads": 4,
    "max_wait": 1.0,
    "heavy_gap": 0.5,
    "light_docs": 2,
    "doc_ms": 50,
}

#: One run: the workload, the clock before the first publish, task id -> (group, publish
#: time), and task id -> the worker's report (``client_id``, ``started_at``, ``finished_at``).
Measured = tuple[Any, float, dict[str, tuple[str, float]], dict[str, dict[str, Any]]]


def measure(workload: str, config: str, args: argparse.Namespace, redis_url: str) -> Measured:
    router, mode, bounded, thresholds = CONFIGS[config]
    dbs = RedisDatabases.from_url(redis_url)
    env = {
        "BROKER_URL": args.broker or dbs.broker,
        "RESULT_BACKEND": dbs.results,
        "DOCUMENT_QUEUE": f"bench-{uuid.uuid4().hex[:6]}",
        "WORKERS_ROUTER": "on" if router else "off",
        "PRIORITY_ROUTER_REDIS_URL": dbs.counter,
        "PRIORITY_ROUTER_KEY_PREFIX": f"bench-{uuid.uuid4().hex[:6]}:",
        "PRIORITY_ROUTER_MODE": mode,
        "PRIORITY_ROUTER_THRESHOLDS": thresholds,
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
        **({"PRIORITY_ROUTER_MAX_WAIT": repr(args.max_wait)} if bounded else {}),
    }
    app = create_app(env)
    seconds, jitter = args.doc_ms / 1000, args.jitter
    shape: Any
    if workload in ("noisy", "starvation"):
        light = round(args.rate * args.stream) if workload == "starvation" else args.light_clients
        shape = NoisyNeighbour(
            heavy=args.heavy[0],
            light_clients=light,  # under starvation every light document comes from a new client
            light_docs=1 if workload == "starvation" else args.light_docs,
            doc_seconds=seconds,
            jitter=0.0 if workload == "starvation" else jitter,
            light_start=0.05,
            light_spread=args.stream if workload == "starvation" else args.light_spread,
            seed=args.seed,
        )
    elif workload == "giants":
        shape = Giants(
            giants=tuple(args.heavy),
            giant_gap=args.heavy_gap,
            medium=tuple(args.medium),
            medium_at=0.1,
            medium_gap=args.medium_gap,
            light_clients=args.light_clients,
            light_docs=args.light_docs,
            light_start=0.1,
            light_spread=args.light_spread,
            doc_min=seconds * (1 - jitter),
            doc_max=seconds * (1 + jitter),
            seed=args.seed,
        )
    elif workload == "steady+burst":
        shape = SteadyBurst(
            steady=args.steady,
            burst=args.burst,
            burst_after=args.burst_after,
            doc_seconds=seconds,
            jitter=jitter,
            seed=args.seed,
        )
    else:
        shape = HeavyMix(
            heavy=tuple(args.heavy),
            heavy_gap=args.heavy_gap,
            light_clients=args.light_clients,
            light_docs=args.light_docs,
            light_spread=args.light_spread,
            doc_seconds=seconds,
            jitter=jitter,
            seed=args.seed,
        )
    with running_worker(env, "--pool", args.pool, "--concurrency", str(args.threads)):
        start = time.time()
        if isinstance(shape, NoisyNeighbour):
            published = publish(app, shape)
        else:
            sent = (
                publish_steady_burst(app, shape)
                if workload == "steady+burst"
                else publish_timed(app, shape.documents())
            )
            published = {tid: (doc.group, at) for tid, (doc, at) in sent.items()}
        results = {tid: app.AsyncResult(tid).get(timeout=600) for tid in published}
    app.close()
    return shape, start, published, results


def metrics(measured: Measured) -> dict[str, Any]:
    _, start, published, results = measured
    light: list[float] = []
    groups: dict[str, list[float]] = defaultdict(list)
    waits: dict[str, list[float]] = defaultdict(list)
    services: dict[str, list[float]] = defaultdict(list)
    heavy: dict[str, float] = {}
    for tid, (group, at) in published.items():
        report = results[tid]
        wait, client = report["started_at"] - at, report["client_id"]
        waits[client].append(wait)
        groups[group].append(wait)
        services[client].append(report["finished_at"] - report["started_at"])
        if group == "light":
            light.append(wait)
        else:
            heavy[client] = max(wait, heavy.get(client, 0.0))
    return {
        "processed": len(results),
        "published": len(published),
        "light_p50": statistics.median(light),
        "light_p95": p95(light),
        "light_max": max(light),
        "heavy_max": heavy,
        "heavy_p95": p95([w for c in heavy for w in waits[c]]),
        "makespan": max(r["finished_at"] for r in results.values()) - start,
        "jain": jain([slowdown(waits[c], services[c]) for c in waits]),
        "groups": by_group(groups, max(r["finished_at"] for r in results.values()) - start),
    }


def by_group(waits: dict[str, list[float]], makespan: float) -> dict[str, float]:
    """Each group's p50, p95 and longest wait, and the makespan: metric -> seconds."""
    out = {"makespan": makespan}
    for group, values in waits.items():
        out |= {
            f"{group} p50": statistics.median(values),
            f"{group} p95": p95(values),
            f"{group} max": max(values),
        }
    return out


def spread(values: list[float], scale: float = 1, form: str = ".2f") -> str:
    values = [v * scale for v in values]
    return f"{statistics.median(values):{form}} ({min(values):{form}}-{max(values):{form}})"


# --- --simulate: the simulator replaying each run ---------------------------------------------


def dispatch_gap(published: Mapping[str, float], results: Mapping[str, dict[str, Any]]) -> float:
    """The median time from a slot's finish to the start of a document that waited for it,
    from task id -> publish time and task id -> the worker's report."""
    finishes = sorted(r["finished_at"] for r in results.values())
    gaps = []
    for tid, at in published.items():
        started = results[tid]["started_at"]
        i = bisect.bisect_right(finishes, started) - 1
        if i >= 0 and finishes[i] > at:
            gaps.append(started - finishes[i])
    return statistics.median(gaps) if gaps else 0.0


def replayed(measured: Measured, config: str, workers: int) -> dict[str, dict[str, float]]:
    """light p95, heavy p95 and makespan of the run's own trace and of the workload as defined."""
    shape, start, published, results = measured
    builder = TraceBuilder()
    for tid, (group, at) in sorted(published.items(), key=lambda item: item[1][1]):
        report = results[tid]
        builder.add(report["client_id"], group, at - start, report["finished_at"] - report["started_at"])
    gap = dispatch_gap({tid: at for tid, (_, at) in published.items()}, results)
    policy = "fifo" if config == "fifo" else "seed"
    table = RouterConfig(thresholds=WIDE_THRESHOLDS) if CONFIGS[config][3] == "wide" else RouterConfig()
    out = {}
    for kind, trace, overhead in (("recorded", builder.build(), gap), ("defined", shape.trace(), 0.0)):
        out[kind] = simulated(trace, policy, table, workers, overhead)
    out["gap"] = {"ms": gap * 1000}
    return out


def simulated(
    trace: Trace, policy: str, table: RouterConfig, workers: int, overhead: float
) -> dict[str, Any]:
    schedule = run(trace, build(policy, table), workers, overhead)
    waits: dict[str, list[float]] = defaultdict(list)
    for doc, c in enumerate(trace.client):
        waits[trace.groups[c]].append(schedule.started[doc] - schedule.published[doc])
    # Both clocks start just before the first publish, as the real run's does.
    makespan = max(schedule.finished) - min(0.0, *schedule.published)
    heavy = [w for g, ws in waits.items() if g != "light" for w in ws]
    return {
        "light_p95": p95(waits["light"]),
        "heavy_p95": p95(heavy),
        "makespan": makespan,
        "groups": by_group(waits, makespan),
    }


def print_simulated(rows: dict[str, list[dict[str, Any]]]) -> None:
    print(
        "\n| run / policy | metric | real | sim: the run's trace | ratio "
        "| sim: the workload as defined | ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {"recorded": [], "defined": []}
    for config, runs in rows.items():
        for metric in ("light_p95", "heavy_p95", "makespan"):
            real = [r[metric] for r in runs]
            cells = [
                f"| {config} (gap {statistics.median(r['sim']['gap']['ms'] for r in runs):.1f} ms) | {metric}"
            ]
            cells.append(f"{statistics.median(real):.3f} s")
            for kind in ("recorded", "defined"):
                each = [r["sim"][kind][metric] / r[metric] for r in runs]
                ratios[kind] += each
                cells.append(
                    f"{statistics.median(r['sim'][kind][metric] for r in runs):.3f} s | {spread(each)}"
                )
            print(" | ".join(cells) + " |")
    for kind, values in ratios.items():
        worst = max(values, key=lambda r: abs(r - 1))
        within = sum(1 for r in values if abs(r - 1) <= 0.2)
        print(f"sim ({kind}) / real, each run: furthest {worst:.2f}; {within} of {len(values)} within 20%")


def print_groups(configs: list[str], first: dict[str, float], rows: dict[str, list[dict[str, Any]]]) -> None:
    """Each group's waits per configuration, the simulator's beside them (medians), and the
    last configuration against the one before it."""
    order = sorted(first, key=lambda m: ("light medium giant makespan".find(m.split()[0]), m))
    med = {
        (c, kind): {
            m: statistics.median((r if kind == "real" else r["sim"]["recorded"])["groups"][m] for r in rs)
            for m in order
        }
        for c, rs in rows.items()
        for kind in ("real", "sim")
    }
    last, before = configs[-1], configs[-2]
    print("\n| metric | " + " | ".join(f"{c} | sim" for c in configs) + f" | {last} / {before} | sim |")
    print("|---|" + "---|---|" * (len(configs) + 1))
    for m in order:
        cells = [f"{med[c, k][m]:.3f}" for c in configs for k in ("real", "sim")]
        cells += [f"{med[last, k][m] / med[before, k][m]:.2f}" for k in ("real", "sim")]
        print(f"| {m} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", choices=WORKLOADS, default="noisy")
    parser.add_argument("--configs", help="comma-separated, of " + ", ".join(CONFIGS))
    parser.add_argument("--broker", help="broker URL (default: the Redis below, db 14)")
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
    parser.add_argument("--pool", default="threads", help="worker pool: threads or prefork")
    parser.add_argument("--threads", type=int, help="worker concurrency")
    parser.add_argument("--max-wait", type=float, help="seconds, for the +max_wait configs")
    parser.add_argument("--heavy", type=int, nargs="+", help="heavy clients' documents")
    parser.add_argument("--heavy-gap", type=float, help="seconds between heavy dumps")
    parser.add_argument("--medium", type=int, nargs="+", default=[60, 50, 40, 30, 25], help="giants: medium")
    parser.add_argument("--medium-gap", type=float, default=1.0, help="giants: seconds between medium dumps")
    parser.add_argument("--light-clients", type=int)
    parser.add_argument("--light-docs", type=int)
    parser.add_argument("--light-spread", type=float, help="seconds the light documents span")
    parser.add_argument("--rate", type=float, default=50, help="starvation: light documents per second")
    parser.add_argument("--stream", type=float, default=15, help="starvation: seconds the stream lasts")
    parser.add_argument("--steady", type=int, default=30)
    parser.add_argument("--burst", type=int, default=150)
    parser.add_argument("--burst-after", type=int, default=5)
    parser.add_argument("--doc-ms", type=float, help="mean document length")
    parser.add_argument("--jitter", type=float, default=0.5, help="lengths uniform in doc-ms*(1 +/- jitter)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--repeat", type=int, default=1, help="run every configuration this many times, in turn"
    )
    parser.add_argument(
        "--simulate", action="store_true", default=None, help="replay each run in the simulator"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    workloads, defaults = WORKLOADS[args.workload]
    for name, value in {**DEFAULTS, **defaults}.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not configs or set(configs) - set(CONFIGS):
        parser.error(f"--configs: choose from {', '.join(CONFIGS)}")
    if args.simulate and args.workload not in ("noisy", "giants"):
        parser.error("--simulate replays the noisy or the giants workload")
    redis_url, stop_redis = redis_or_embedded(args.redis.rstrip("/"))
    began = time.monotonic()
    rows: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    try:
        for _ in range(max(1, args.repeat)):
            for workload in workloads:
                for config in configs:
                    measured = measure(workload, config, args, redis_url)
                    row = {"workload": workload, "config": config, **metrics(measured)}
                    if args.simulate:
                        row["sim"] = replayed(measured, config, args.threads)
                    rows[workload, config].append(row)
    finally:
        stop_redis()
    if args.json:
        print(json.dumps([r for runs in rows.values() for r in runs], indent=2))
        return
    broker = (args.broker or redis_url).split("://")[0]
    print(
        f"broker={broker} pool={args.pool} threads={args.threads} doc={args.doc_ms:.0f} ms "
        f"+/- {args.jitter:.0%} max_wait={args.max_wait:g} s; medians of {max(1, args.repeat)} "
        f"(range); {time.monotonic() - began:.0f} s"
    )
    for workload in workloads:
        print(f"\n{workload}\n")
        heavies = list(rows[workload, configs[0]][0]["heavy_max"])[:3]
        print(
            "| config | light p50 ms | light p95 ms | light max ms | "
            + "".join(f"{c} longest s | " for c in heavies)
            + "makespan s | Jain | processed |"
        )
        print("|---|---|---|---|" + "---|" * len(heavies) + "---|---|---|")
        for config in configs:
            runs = rows[workload, config]
            heavy = "".join(f"{spread([r['heavy_max'][c] for r in runs])} | " for c in heavies)
            done = f"{sum(r['processed'] for r in runs)}/{sum(r['published'] for r in runs)}"
            print(
                f"| {config} | {spread([r['light_p50'] for r in runs], 1000, '.0f')} | "
                f"{spread([r['light_p95'] for r in runs], 1000, '.0f')} | "
                f"{spread([r['light_max'] for r in runs], 1000, '.0f')} | {heavy}"
                f"{spread([r['makespan'] for r in runs])} | "
                f"{spread([r['jain'] for r in runs], 1, '.3f')} | {done} |"
            )
        base = rows[workload, configs[0]]
        for config in configs[1:]:  # round by round, against the first configuration
            runs = rows[workload, config]
            p95s = [b["light_p95"] / r["light_p95"] for b, r in zip(base, runs, strict=True)]
            p50s = [r["light_p50"] / b["light_p50"] for b, r in zip(base, runs, strict=True)]
            spans = [r["makespan"] / b["makespan"] for b, r in zip(base, runs, strict=True)]
            print(
                f"{config} against {configs[0]}: light p95 {spread(p95s, 1, '.1f')}x shorter, "
                f"light p50 {spread(p50s)}x, makespan {spread(spans, 1, '.3f')}x"
            )
    if args.workload == "giants":
        print_groups(
            configs, rows["giants", configs[0]][0]["groups"], {c: rows["giants", c] for c in configs}
        )
    elif args.simulate:
        print_simulated({config: rows["noisy", config] for config in configs})


if __name__ == "__main__":
    main()
