"""Migrating a live RabbitMQ queue: ``workers.rabbitmq_migration`` (the benchmarks use it too)."""

from workers.rabbitmq_migration import (  # noqa: F401 - re-exported for the tests
    Publisher,
    Sent,
    migrate_command,
    publish_backlog,
    queue_contents,
    ran,
    run_migrate,
)
