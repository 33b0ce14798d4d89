"""What the installed Celery can do, for the tests that need a newer one than the oldest
supported (``make matrix`` runs them all on each supported Celery)."""

from __future__ import annotations

import pytest
from celery.app.defaults import DEFAULTS

#: Celery 5.5 added ``task_default_queue_type``: before it, Celery declares classic queues.
HAS_QUEUE_TYPE_SETTING = "task_default_queue_type" in DEFAULTS

needs_queue_type_setting = pytest.mark.skipif(
    not HAS_QUEUE_TYPE_SETTING,
    reason="Celery before 5.5 has no task_default_queue_type (it declares classic queues)",
)
