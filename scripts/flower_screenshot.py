"""Screenshot Flower's task page for a routed document (docs/flower-task.png).

Starts a worker and Flower on a Redis (``REDIS_URL``, the local one, or an embedded one),
publishes a small burst for one client, and photographs one task page with headless
Chromium (Debian: ``apt-get install chromium``).  ``--page list`` instead publishes a
noisy-neighbour load (one heavy client, three light ones) and photographs Flower's task
list, started with ``--tasks_columns`` including ``kwargs`` and the README's ``format_task``
(docs/flower-tasks-list.png).

    python scripts/flower_screenshot.py [--page task|list] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from celery import Celery

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.services import (  # noqa: E402
    Flower,
    RedisDatabases,
    redis_answers,
    running_worker,
    start_embedded_redis,
)

#: Flower's default task-list columns plus kwargs, where the router writes its decision.
TASKS_COLUMNS = "name,uuid,state,kwargs,received,runtime,worker"
#: The README's flowerconfig.py: Flower cuts the kwargs cell at 400 px, so lead with the decision.
FLOWERCONFIG = r"""
import re

_DECISION = re.compile(r"'priority_router_(client|priority|pending)': ('[^']*'|-?\d+)")


def format_task(task):
    decision = _DECISION.findall(task.kwargs or "")
    if decision:
        task.kwargs = " ".join(f"{k}={v}" for k, v in decision) + " | " + task.kwargs
    return task
"""
OUT = {"task": ROOT / "docs" / "flower-task.png", "list": ROOT / "docs" / "flower-tasks-list.png"}


def send(app: Celery, client: str, document: str, pages: int) -> str:
    result = app.send_task(
        "workers.process_document", (client, document, pages), headers={"client_id": client}
    )
    return str(result.id)


def noisy_neighbour(app: Celery) -> list[str]:
    """A 24-document burst from acme while three light clients send a few documents each."""
    ids = [send(app, "acme", f"invoice-{n}", 40) for n in range(24)]
    light = ("globex", "initech", "umbrella")
    for n in range(12):
        time.sleep(0.35)
        client = light[n % len(light)]
        ids.append(send(app, client, f"{client}-{n // len(light)}", 2))
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--page", choices=sorted(OUT), default="task", help="task page or task list")
    parser.add_argument("--out", type=Path, help="default: docs/flower-task(s-list).png")
    args = parser.parse_args()
    args.out = args.out or OUT[args.page]
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        raise SystemExit("headless Chromium is needed: apt-get install chromium")

    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379").rstrip("/")
    embedded = None
    if not redis_answers(url):
        embedded = start_embedded_redis()
        url = embedded.url
    tag = uuid.uuid4().hex[:6]
    env = {
        "BROKER_URL": RedisDatabases.from_url(url).broker,
        "RESULT_BACKEND": RedisDatabases.from_url(url).results,
        "DOCUMENT_QUEUE": f"screenshot-{tag}",
        "PRIORITY_ROUTER_REDIS_URL": RedisDatabases.from_url(url).counter,
        "PRIORITY_ROUTER_KEY_PREFIX": f"screenshot-{tag}:",
    }
    os.environ.update(env)
    from workers.app import create_app

    app = create_app(env)
    conf = tempfile.TemporaryDirectory(prefix="flowerconfig-")
    flower_env = {**env, "FLOWER_TASKS_COLUMNS": TASKS_COLUMNS}
    if args.page == "list":
        flower_env["FLOWER_CONF"] = str(Path(conf.name) / "flowerconfig.py")
        Path(flower_env["FLOWER_CONF"]).write_text(FLOWERCONFIG)
    flower = Flower(flower_env)
    try:
        flower.wait_ready()
        with running_worker(env, "--pool", "solo"):
            time.sleep(2)  # Flower subscribes to the worker's events
            if args.page == "list":
                ids = noisy_neighbour(app)
            else:
                ids = [send(app, "acme", f"invoice-{n}", 2) for n in range(6)]
            for tid in ids:
                app.AsyncResult(tid).get(timeout=60)
            time.sleep(1.5)
            target = f"{flower.url}/tasks" if args.page == "list" else f"{flower.url}/task/{ids[-1]}"
            size = "1800,1060" if args.page == "list" else "1280,1000"
            urllib.request.urlopen(target, timeout=10).read()
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="flower-shot-") as profile:
                # A fresh profile: the list keeps its sort and paging in localStorage. The
                # virtual-time budget lets the list's AJAX request finish before the shot.
                subprocess.run(
                    [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=5000",
                     f"--screenshot={args.out}", f"--window-size={size}", target],
                    check=True, capture_output=True, timeout=60,
                )  # fmt: skip
            print(f"wrote {args.out} ({target})")
    finally:
        flower.stop()
        conf.cleanup()
        app.close()
        if embedded:
            embedded.stop()


if __name__ == "__main__":
    main()
