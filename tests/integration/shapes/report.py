"""What a task saw of its own message, for the tests to assert on."""

from __future__ import annotations

import time
from typing import Any

from celery import Task

from priority_router import headers as H


def seen(task: Task, client_id: str, document_id: str, seconds: float) -> dict[str, Any]:
    started = time.time()
    time.sleep(seconds)
    request = task.request
    return {
        "client_id": client_id,
        "document_id": document_id,
        "priority": getattr(request, H.PRIORITY, None),
        "reason": getattr(request, H.REASON, None),
        "wire_priority": (request.delivery_info or {}).get("priority"),
        "queue": (request.delivery_info or {}).get("routing_key"),
        "started_at": started,
    }
