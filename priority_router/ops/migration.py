"""What a queue migration did, or would do: the report every broker's mover returns.

``priority-router migrate QUEUE --to router|plain`` moves a live queue between the
router's layout and plain Celery's; ``migrate_redis.py`` and ``migrate_rabbitmq.py`` do
the moving, each step logged as it happens and listed in the report.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

logger = logging.getLogger("priority_router.migrate")


class Target(str, Enum):
    """The kind of worker a queue is migrated for."""

    ROUTER = "router"
    PLAIN = "plain"


#: The step that moves a RabbitMQ queue's messages out to its holding queue.
MOVED_OUT = "moved out"


@dataclass
class Step:
    """One thing the migration did (or, in a dry run, would do)."""

    action: str
    detail: str
    #: Messages this step moved.
    messages: int = 0


@dataclass
class MigrationReport:
    queue: str
    broker: str
    target: Target
    dry_run: bool
    steps: list[Step] = field(default_factory=list)
    #: False when there was nothing to do: the queue already suits ``target``.
    changed: bool = False
    #: What the operator should know or do next.
    notes: list[str] = field(default_factory=list)

    @property
    def moved(self) -> int:
        """Messages moved into the queue's new form; on RabbitMQ each also went out to the
        holding queue first, a step of its own with its count, not counted again here."""
        return sum(s.messages for s in self.steps if s.action != MOVED_OUT)

    def step(self, action: str, detail: str, messages: int = 0) -> None:
        """Record a step and log it as it happens (a dry run logs what it would do)."""
        self.steps.append(Step(action, detail, messages))
        would = "would " if self.dry_run and action != "nothing to move" else ""
        logger.info("migrate %s: %s%s: %s", self.queue, would, action, detail)

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "broker": self.broker,
            "to": self.target.value,
            "dry_run": self.dry_run,
            "changed": self.changed,
            "moved": self.moved,
            "steps": [vars(s) for s in self.steps],
            "notes": list(self.notes),
        }
