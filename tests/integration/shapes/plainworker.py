"""A worker codebase that never installed the router (plain Celery)."""

from celery import Celery

from shapes._config import settings

app = Celery("plainworker", include=["shapes.shape_tasks"])
app.conf.update(settings())
