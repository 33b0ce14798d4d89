"""Django-style settings: Celery's options with the ``CELERY_`` namespace."""

import os

CELERY_BROKER_URL = os.environ["BROKER_URL"]
CELERY_RESULT_BACKEND = os.environ["RESULT_BACKEND"]
CELERY_TASK_DEFAULT_QUEUE = os.environ["DOCUMENT_QUEUE"]
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
if os.environ.get("QUEUE_TYPE"):
    CELERY_TASK_DEFAULT_QUEUE_TYPE = os.environ["QUEUE_TYPE"]
