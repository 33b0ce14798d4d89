"""A worker codebase with the router installed."""

from celery import Celery

from priority_router import PriorityRouter
from shapes._config import settings

app = Celery("docworker", include=["shapes.shape_tasks"])
app.conf.update(settings())
PriorityRouter.from_env().install(app)
