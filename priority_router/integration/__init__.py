"""Celery integration: installing on an app, stamping publishes, broker settings and queues,
Flower, the worker side and metrics."""
