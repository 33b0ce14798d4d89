"""Calling the publish receiver directly, as Celery's sender would."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from celery import Celery

from priority_router.integration.sender import publishing_app


@contextlib.contextmanager
def publishing_as(app: Celery) -> Iterator[None]:
    """Run a block as if ``app``'s task sender were publishing."""
    token = publishing_app.set(app)
    try:
        yield
    finally:
        publishing_app.reset(token)
