"""How soon an idle worker starts a document (Redis broker): the cost of the reliable fetch's
wait (docs/failure.md), which watches one list only.

A real worker (``--pool``, ``-c 2``) waits with nothing queued; documents are sent one at a
time, ``--gap`` seconds apart, each from a new client (the router's priority for a client
with nothing pending, the list the worker waits on) and then each with an explicit
``priority=5`` (another list).  Reported: the median and p90 of publish-to-start, per kind.
Run it in a checkout before and after a change to compare:

    python bench/idle_fetch.py --redis redis://127.0.0.1:6379
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from workers.app import create_app  # noqa: E402
from workers.services import running_worker  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--redis", default="redis://127.0.0.1:6379", help="a Redis server (databases 1-3 are used)"
    )
    parser.add_argument("--pool", default="threads")
    parser.add_argument("--docs", type=int, default=25, help="documents of each kind")
    parser.add_argument("--gap", type=float, default=0.25)
    args = parser.parse_args()
    server = args.redis.rstrip("/")
    queue = f"idle-{uuid.uuid4().hex[:8]}"
    env = {
        "BROKER_URL": f"{server}/1",
        "RESULT_BACKEND": f"{server}/2",
        "PRIORITY_ROUTER_REDIS_URL": f"{server}/3",
        "PRIORITY_ROUTER_KEY_PREFIX": f"{queue}:",
        "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
        "DOCUMENT_QUEUE": queue,
    }
    app = create_app(env)
    with running_worker(env, "--pool", args.pool, "--concurrency", "2"):
        time.sleep(1)
        for kind, options in (("a new client's", {}), ("priority=5", {"priority": 5})):
            waits = []
            for n in range(args.docs):
                sent = time.time()
                client = f"c{n}-{kind}"
                result = app.send_task(
                    "workers.hold_document", (client, f"d{n}", 0), headers={"client_id": client}, **options
                )
                waits.append(result.get(timeout=30)["started_at"] - sent)
                time.sleep(args.gap)
            waits.sort()
            p90 = waits[int(len(waits) * 0.9)]
            print(f"{kind}: median {statistics.median(waits) * 1000:.0f} ms, p90 {p90 * 1000:.0f} ms")
    app.close()


if __name__ == "__main__":
    main()
