"""The Celery app the fairness benchmark's workers run: plain, or with the router.

``BENCH_MODE=router`` installs the router; anything else is plain Celery with its
defaults, as a team would run it before adopting priority-router.
"""

from __future__ import annotations

import os

from celery import Celery

from priority_router import PriorityRouter

app = Celery("bench", include=["workers.tasks"])
app.conf.update(
    broker_url=os.environ["BROKER_URL"],
    result_backend=os.environ["RESULT_BACKEND"],
    task_default_queue=os.environ["DOCUMENT_QUEUE"],
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
)
if os.environ.get("BENCH_MODE") == "router":
    PriorityRouter.from_env().install(app)
