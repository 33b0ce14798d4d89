"""A runnable Celery worker app for document tasks (``celery -A workers.app worker``)."""
