"""``migrate`` on RabbitMQ (placeholder until the mover lands)."""

from __future__ import annotations

from celery import Celery

from ..errors import ConfigurationError
from .migration import MigrationReport, Target


def migrate(app: Celery, queue: str, target: Target, dry_run: bool = False) -> MigrationReport:
    raise ConfigurationError("migrate", "RabbitMQ queues cannot be migrated yet", "see the README")
