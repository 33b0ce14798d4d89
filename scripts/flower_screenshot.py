"""Screenshot Flower's task page for a routed document (docs/flower-task.png).

Starts a worker and Flower on a Redis (``REDIS_URL``, the local one, or an embedded one),
publishes a small burst for two clients, and photographs one task page with headless
Chromium (Debian: ``apt-get install chromium``).

    python scripts/flower_screenshot.py [--out docs/flower-task.png]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.services import Flower, redis_answers, running_worker, start_embedded_redis  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "flower-task.png")
    args = parser.parse_args()
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
        "BROKER_URL": url + "/14",
        "RESULT_BACKEND": url + "/15",
        "DOCUMENT_QUEUE": f"screenshot-{tag}",
        "PRIORITY_ROUTER_REDIS_URL": url + "/13",
        "PRIORITY_ROUTER_KEY_PREFIX": f"screenshot-{tag}:",
    }
    os.environ.update(env)
    from workers.app import create_app

    app = create_app(env)
    flower = Flower(env)
    try:
        flower.wait_ready()
        with running_worker(env, "--pool", "solo"):
            time.sleep(2)  # Flower subscribes to the worker's events
            ids = [
                app.send_task(
                    "workers.process_document", ("acme", f"invoice-{n}", 2), headers={"client_id": "acme"}
                ).id
                for n in range(6)
            ]
            for tid in ids:
                app.AsyncResult(tid).get(timeout=60)
            time.sleep(1.5)
            target = f"{flower.url}/task/{ids[-1]}"
            urllib.request.urlopen(target, timeout=10).read()
            args.out.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                 f"--screenshot={args.out}", "--window-size=1280,1000", target],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
            print(f"wrote {args.out} ({target})")
    finally:
        flower.stop()
        app.close()
        if embedded:
            embedded.stop()


if __name__ == "__main__":
    main()
