"""The project's document tasks, found by ``autodiscover_tasks``."""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from shapes.report import seen


@shared_task(bind=True, name="djproj.process")
def process(self: Task, client_id: str, document_id: str, seconds: float = 0.02) -> dict[str, Any]:
    return seen(self, client_id, document_id, seconds)
