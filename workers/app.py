"""The example document workers' Celery app, configured from the environment as
``priority_router.demo.app.create_app`` describes (``BROKER_URL``, ``RESULT_BACKEND``,
``DOCUMENT_QUEUE``, ``WORKER_INCLUDE``, ``BROKER_TRANSPORT_OPTIONS``, ``WORKERS_ROUTER``
and the ``PRIORITY_ROUTER_*`` variables).

Start it with ``celery -A workers.app worker``.
"""

from __future__ import annotations

from collections.abc import Mapping

from celery import Celery

from priority_router.demo import app as demo_app


def create_app(environ: Mapping[str, str] | None = None) -> Celery:
    return demo_app.create_app(environ, main="workers", include=["workers.tasks"])


app = create_app()
