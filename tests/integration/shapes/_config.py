"""The settings every shape reads from the environment."""

from __future__ import annotations

import os
from typing import Any


def settings() -> dict[str, Any]:
    return {
        "broker_url": os.environ["BROKER_URL"],
        "result_backend": os.environ["RESULT_BACKEND"],
        "task_default_queue": os.environ["DOCUMENT_QUEUE"],
        "task_serializer": "json",
        "accept_content": ["json"],
        "broker_connection_retry_on_startup": True,
    }
