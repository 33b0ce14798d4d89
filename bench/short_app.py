"""``workers.app`` with extra Celery settings from ``CELERY_SETTINGS`` (a JSON object), set
as a user's own: the worker of ``bench/short_documents.py``'s modes that change a setting
the router would otherwise choose.  Start it with ``celery -A bench.short_app worker``."""

from __future__ import annotations

import json
import os
from typing import Any

from celery import bootsteps

from workers.app import create_app

app = create_app()
app.conf.update(json.loads(os.environ.get("CELERY_SETTINGS") or "{}"))


class _WiderWindow(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """``WINDOW_EXTRA=k``: the consumer's prefetch window k documents above what the
    multiplier gives (a trial of a window of concurrency + k)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, parent: Any) -> None:
        extra = int(os.environ.get("WINDOW_EXTRA") or 0)
        if extra and parent.qos is not None:
            parent.qos.increment_eventually(extra)
            parent.qos.update()


app.steps["consumer"].add(_WiderWindow)
