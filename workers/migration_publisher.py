"""A real Celery publisher that keeps publishing while a queue is migrated.

    python workers/migration_publisher.py OUT STOP [--rate 50] [--seconds 0]

Publishes ``workers.hold_document`` documents with the ``workers.app`` app configured from
the environment (``BROKER_URL``, ``DOCUMENT_QUEUE``, ``WORKERS_ROUTER``,
``PRIORITY_ROUTER_*``), ``--rate`` per second, until the file STOP exists.  After each
publish returns it appends ``task-id<TAB>start<TAB>seconds it took`` to OUT (``start`` on
the system's monotonic clock, which every process shares), so the caller knows every
document that was sent, and when and how long each publish was held.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("stop")
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=0.0, help="how long each document holds a worker")
    args = parser.parse_args()

    from workers.app import create_app

    app = create_app()
    tag = os.environ.get("PUBLISHER_TAG") or uuid.uuid4().hex[:6]
    started = time.monotonic()
    with open(args.out, "a", buffering=1) as out:
        n = 0
        while not os.path.exists(args.stop):
            due = started + n / args.rate
            time.sleep(max(0.0, due - time.monotonic()))
            task_id = f"{tag}-live-{n}"
            before = time.monotonic()
            app.send_task(
                "workers.hold_document",
                ("live", task_id, args.seconds),
                task_id=task_id,
                headers={"client_id": "live"},
            )
            out.write(f"{task_id}\t{before:.4f}\t{time.monotonic() - before:.4f}\n")
            n += 1
    app.close()


if __name__ == "__main__":
    main()
