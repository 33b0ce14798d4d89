"""A web process of the publisher-only codebase (``pubsite``): it logs as a web app does,
sends one burst of a client's documents by name, then keeps serving (sleeps) for
``WEB_SECONDS`` seconds.  Run as ``python -m shapes.web_process``."""

from __future__ import annotations

import logging
import os
import sys
import time

logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s %(levelname)s %(message)s")

from shapes.pubsite import app  # noqa: E402 - the log is set up first, as a web app's is

client = os.environ["WEB_CLIENT"]
for n in range(int(os.environ.get("WEB_DOCUMENTS", "33"))):
    app.send_task("docs.process", (client, f"d{n}", 0), headers={"client_id": client})
print("published", flush=True)
time.sleep(float(os.environ["WEB_SECONDS"]))
