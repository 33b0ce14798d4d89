"""What one ``apply_async`` holds an asyncio event loop (FastAPI, Starlette), plain Celery
against Celery with the router, in the same run.

A publish is synchronous: called in a coroutine, it holds the loop for as long as it takes,
and the router's counter check runs inside it (one Redis round trip).  Each round starts a
fresh process per variant (``plain``, ``router``), alternating, so that a shared, noisy
machine drifts both alike; each process publishes ``--publishes`` documents from a
coroutine on a running loop, after a warm-up, and reports the median and p99 time one
publish held the loop.  The figure is the median over ``--rounds`` rounds, and the ratio.

    python bench/asyncio_publish.py [--redis redis://127.0.0.1:6379] [--rounds 3] [--publishes 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from priority_router.router import engine_of

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

VARIANTS = ("plain", "router")


def publish_in_loop(variant: str, redis_url: str, publishes: int) -> dict[str, float]:
    """One variant in this process: the times (µs) single publishes held a running loop."""
    from celery import Celery

    from priority_router import PriorityRouter

    queue = f"asyncio-bench-{uuid.uuid4().hex[:8]}"
    app = Celery("bench", broker=f"{redis_url}/11", set_as_current=False)
    app.conf.task_default_queue = queue
    router = None
    if variant == "router":
        router = PriorityRouter(redis_url=f"{redis_url}/12", key_prefix=f"{queue}:")
        router.install(app)

    @app.task(name="bench.noop")
    def noop(doc: str) -> None: ...

    async def publish(n: int) -> list[float]:
        held = []
        for i in range(n):
            started = time.perf_counter()
            noop.apply_async((f"d{i}",), headers={"client_id": f"client{i % 50}"})
            held.append((time.perf_counter() - started) * 1e6)
            await asyncio.sleep(0)  # as a request handler would, between publishes
        return held

    asyncio.run(publish(300))  # connections, the schema, caches
    held = sorted(asyncio.run(publish(publishes)))
    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)
    if router is not None:
        engine_of(router).store.clear_all()
    return {"p50": statistics.median(held), "p99": held[int(len(held) * 0.99)]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--publishes", type=int, default=2000)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # one process's part
    args = parser.parse_args()
    redis_url = args.redis.rstrip("/")
    if args.variant:
        print(json.dumps(publish_in_loop(args.variant, redis_url, args.publishes)))
        return
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            command = [sys.executable, __file__, "--variant", variant, "--redis", redis_url]
            out = subprocess.run(
                [*command, "--publishes", str(args.publishes)], check=True, capture_output=True, text=True
            )
            runs[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"one apply_async on a running event loop, median of {args.rounds} rounds of {args.publishes}:")
    print("| variant | p50 held | p99 held |")
    print("|---|---|---|")
    medians = {}
    for variant in VARIANTS:
        p50 = statistics.median(r["p50"] for r in runs[variant])
        p99 = statistics.median(r["p99"] for r in runs[variant])
        medians[variant] = p50
        print(f"| {variant} | {p50:.0f} µs | {p99:.0f} µs |")
    print(f"router / plain at p50: {medians['router'] / medians['plain']:.2f}x")
    print("command: python bench/asyncio_publish.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
