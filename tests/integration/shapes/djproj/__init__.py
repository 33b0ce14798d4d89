"""A Django-style project: ``proj/__init__.py`` imports the Celery app so it loads with the project."""

from .celery import app

__all__ = ["app"]
