"""A publisher-only codebase (a web app): no task code, sends by name, router installed."""

from celery import Celery

from priority_router import PriorityRouter
from shapes._config import settings

app = Celery("pubsite")
app.conf.update(settings())
PriorityRouter.from_env().install(app)
