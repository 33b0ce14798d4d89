"""A publisher-only codebase without the router."""

from celery import Celery

from shapes._config import settings

app = Celery("plainsite")
app.conf.update(settings())
