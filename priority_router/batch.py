"""Decisions reserved for a batch of one client's documents, counted in one round trip.

``PriorityRouter.batch(client, n)`` counts ``n`` documents at once and makes the
decisions current for the ``with`` block: each counted publish of that client inside
it takes the next one instead of asking Redis.  Publishes beyond ``n`` are counted one
by one as usual; other clients' publishes are not affected.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from contextvars import ContextVar

from .decision import Decision

logger = logging.getLogger("priority_router")


class Batch:
    """The reserved decisions of one ``with router.batch(...)`` block, in publish order."""

    def __init__(self, client_id: str, decisions: Sequence[Decision]) -> None:
        self.client_id = client_id
        self.decisions: tuple[Decision, ...] = tuple(decisions)
        self._left = deque(self.decisions)

    @property
    def remaining(self) -> int:
        """Reserved decisions no publish has taken yet."""
        return len(self._left)

    def take(self, client_id: str) -> Decision | None:
        if client_id != self.client_id or not self._left:
            return None
        return self._left.popleft()

    def close(self) -> None:
        """Warn about reserved decisions no publish took (``remaining`` keeps their number)."""
        if self._left:
            logger.warning(
                "priority-router: a batch for client %r reserved %d documents but published %d; "
                "the %d unused still count against it until its reset. Fix: reserve exactly as many "
                "documents as the block publishes (router.batch(client, len(documents)))",
                self.client_id,
                len(self.decisions),
                len(self.decisions) - len(self._left),
                len(self._left),
            )

    def __repr__(self) -> str:
        return (
            f"<Batch {self.client_id!r} {len(self.decisions) - self.remaining}/{len(self.decisions)} taken>"
        )


#: The innermost open batch of this thread or task.
current_batch: ContextVar[Batch | None] = ContextVar("priority_router_batch", default=None)
