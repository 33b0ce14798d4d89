"""The demo's workers: ``celery -A priority_router.demo.worker worker``, configured from the
environment (``priority_router.demo.app``), with the demo's one task registered on the app
itself (not as a shared task, so no other app in the process gets it)."""

from __future__ import annotations

from .app import create_app
from .documents import HOLD, hold

app = create_app()
hold_document = app.task(bind=True, name=HOLD, acks_late=True, shared=False)(hold)
