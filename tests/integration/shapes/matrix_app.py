"""The shapes matrix's app: the router's settings come from the source ``SHAPE_SOURCE`` names.

``constructor`` passes them as keywords, ``environment`` leaves them to the
``PRIORITY_ROUTER_*`` variables the test sets, ``celery`` writes them as Celery settings,
and ``django`` as ``CELERY_PRIORITY_ROUTER_*`` in a Django-style settings module read with
the ``CELERY`` namespace, the router installed before the configuration exists.
"""

from __future__ import annotations

import os

from celery import Celery

from priority_router import PriorityRouter

SOURCE = os.environ["SHAPE_SOURCE"]
ROUTER = {
    "redis_url": os.environ["SHAPE_STORE_URL"],
    "key_prefix": os.environ["SHAPE_KEY_PREFIX"],
    "mode": "inflight",
    "consumer_check_interval": 0,
}

app = Celery("matrix", include=["shapes.matrix_tasks"])
if SOURCE == "django":
    PriorityRouter().install(app)
    app.config_from_object("shapes.matrix_django_settings", namespace="CELERY")
else:
    app.conf.update(
        broker_url=os.environ["BROKER_URL"],
        task_default_queue=os.environ["DOCUMENT_QUEUE"],
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
    )
    if SOURCE == "constructor":
        PriorityRouter(**ROUTER).install(app)
    elif SOURCE == "celery":
        app.conf.update({f"priority_router_{name}": value for name, value in ROUTER.items()})
        PriorityRouter().install(app)
    elif SOURCE == "environment":
        PriorityRouter().install(app)
    else:
        raise SystemExit(f"unknown SHAPE_SOURCE {SOURCE!r}")
