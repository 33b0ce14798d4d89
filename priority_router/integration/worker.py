"""What an installed router does inside a worker: measure queue wait, serve metrics."""

from __future__ import annotations

import logging
import os
import weakref
from typing import Any

from celery import Celery
from celery.signals import task_prerun, worker_ready

from ..metrics import RouterMetrics, serve

logger = logging.getLogger("priority_router")


def watch_queue_wait(app: Celery, metrics: RouterMetrics, port: int | None) -> None:
    """Record each of ``app``'s tasks' queue wait; serve metrics on ``port`` when the
    worker is ready (``port`` None: the user exposes the default registry themselves).

    The receivers hold the app weakly and go away with it, so an app dropped without
    ``uninstall`` can still be collected."""
    app_ref = weakref.ref(app)
    uids = (f"priority_router:wait:{id(app)}", f"priority_router:metrics:{id(app)}")
    weakref.finalize(app, _disconnect, *uids)

    def on_prerun(sender: Any = None, task: Any = None, **_: Any) -> None:
        if task is None or getattr(task, "app", None) is not app_ref():
            return
        try:
            metrics.observe_start(task.request)
        except Exception:
            logger.debug("could not record queue wait", exc_info=True)

    task_prerun.connect(on_prerun, weak=False, dispatch_uid=uids[0])
    if port is None:
        return

    def on_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app_ref():
            return
        try:
            served = serve(port)
        except OSError as exc:  # another process on this host serves that port
            shared = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
            logger.error(
                "priority-router cannot serve metrics on port %d (%s), so this worker serves none. "
                "Fix: give each worker on a host its own metrics_port (0 picks a free one, logged)%s",
                port,
                exc.strerror or exc,
                f", or leave it: a worker on this host serving {shared!r} shows this one's metrics too"
                if shared
                else "",
            )
            return
        logger.info("priority-router metrics on http://0.0.0.0:%d/metrics", served)
        pool = getattr(sender, "pool", None)
        if type(pool).__module__.endswith("prefork") and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            logger.warning(
                "prefork workers run tasks in child processes: set PROMETHEUS_MULTIPROC_DIR to an "
                "empty directory before the worker starts, or their queue-wait metrics are not served"
            )

    worker_ready.connect(on_ready, weak=False, dispatch_uid=uids[1])


def unwatch(app: Celery) -> None:
    """Undo :func:`watch_queue_wait` for ``app`` (a server already started keeps running)."""
    _disconnect(f"priority_router:wait:{id(app)}", f"priority_router:metrics:{id(app)}")


def _disconnect(wait_uid: str, ready_uid: str) -> None:
    task_prerun.disconnect(dispatch_uid=wait_uid)
    worker_ready.disconnect(dispatch_uid=ready_uid)
