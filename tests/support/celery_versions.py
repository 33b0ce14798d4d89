"""What the installed Celery can do, for the tests that need a newer one than the oldest
supported (``make matrix`` runs them all on each supported Celery)."""

from __future__ import annotations

import pytest
from celery.app.defaults import DEFAULTS

from priority_router.integration.old_kombu import FULL, kombu_version

#: Celery 5.5 added ``task_default_queue_type``: before it, Celery declares classic queues.
HAS_QUEUE_TYPE_SETTING = "task_default_queue_type" in DEFAULTS

needs_queue_type_setting = pytest.mark.skipif(
    not HAS_QUEUE_TYPE_SETTING,
    reason="Celery before 5.5 has no task_default_queue_type (it declares classic queues)",
)

#: kombu 5.7 added ``unacked_restore_interval`` and ``unacked_restore_throttle``: before it a
#: Redis broker sweeps a dead worker's unacked documents about every 100 s, whatever
#: FAST_REDELIVERY asks (priority_router/integration/old_kombu.py).
HAS_RESTORE_OPTIONS = kombu_version() >= FULL


def skip_without_fast_redelivery(broker_url: str) -> None:
    """Skip a test that waits for a killed worker's documents on Redis, where this kombu
    brings them back only after about 100 s."""
    if broker_url.startswith("redis") and not HAS_RESTORE_OPTIONS:
        pytest.skip("kombu before 5.7 sweeps a dead worker's unacked documents about every 100 s")
