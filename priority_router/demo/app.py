"""A Celery app for document tasks, configured from the environment.

| variable | default |
|---|---|
| ``BROKER_URL`` | ``redis://localhost:6379/0`` |
| ``RESULT_BACKEND`` | unset (no results kept) |
| ``DOCUMENT_QUEUE`` | ``documents`` |
| ``WORKER_INCLUDE`` | extra task modules, comma-separated |
| ``BROKER_TRANSPORT_OPTIONS`` | JSON object, e.g. ``{"visibility_timeout": 7200}`` |
| ``WORKERS_ROUTER`` | ``on``; ``off`` runs plain Celery (the demo's and benchmarks' baseline) |
| ``PRIORITY_ROUTER_*`` | see the README's configuration reference |

The demo's workers (``priority_router.demo.worker``) and the repository's example workers
(``workers/app.py``) are both made here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

from celery import Celery

from ..router import PriorityRouter


def create_app(
    environ: Mapping[str, str] | None = None,
    *,
    main: str = "priority_router.demo",
    include: Sequence[str] = (),
) -> Celery:
    """An app named ``main`` whose workers import the task modules ``include`` (and those
    ``WORKER_INCLUDE`` names), configured from ``environ`` (``os.environ`` by default)."""
    env = os.environ if environ is None else environ
    extra = [m.strip() for m in env.get("WORKER_INCLUDE", "").split(",") if m.strip()]
    app = Celery(main, include=[*include, *extra])
    app.conf.update(
        broker_url=env.get("BROKER_URL", "redis://localhost:6379/0"),
        result_backend=env.get("RESULT_BACKEND") or None,
        task_default_queue=env.get("DOCUMENT_QUEUE", "documents"),
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_send_sent_event=True,
        worker_send_task_events=True,
        broker_connection_retry_on_startup=True,
    )
    if env.get("BROKER_TRANSPORT_OPTIONS"):
        app.conf.broker_transport_options = json.loads(env["BROKER_TRANSPORT_OPTIONS"])
    if env.get("WORKERS_ROUTER", "on").strip().lower() not in ("0", "false", "no", "off"):
        PriorityRouter.from_env(environ=env).install(app)
    return app
