"""The example workers' document tasks (what they do: ``priority_router.demo.documents``)."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from celery import Task, shared_task

from priority_router.demo.documents import hold, report

#: CPU work per page: this many SHA-256 rounds over a 4 KiB block (about 10 ms here).
ROUNDS_PER_PAGE = 2000
_BLOCK = bytes(range(256)) * 16


@shared_task(bind=True, name="workers.process_document", acks_late=True)
def process_document(self: Task, client_id: str, document_id: str, pages: int = 1) -> dict[str, Any]:
    """Process a document: CPU work proportional to its pages."""
    started = time.time()
    digest = _BLOCK
    for _ in range(max(0, int(pages)) * ROUNDS_PER_PAGE):
        digest = hashlib.sha256(digest + _BLOCK).digest()
    done = report(self, client_id, document_id, started)
    done["pages"] = pages
    done["digest"] = digest.hex()[:16]
    return done


@shared_task(bind=True, name="workers.hold_document", acks_late=True)
def hold_document(self: Task, client_id: str, document_id: str, seconds: float = 0.05) -> dict[str, Any]:
    """A document that keeps a worker slot for ``seconds`` (waiting on I/O, say)."""
    return hold(self, client_id, document_id, seconds)


@shared_task(bind=True, name="workers.sleep_document")
def sleep_document(self: Task, client_id: str, document_id: str, seconds: float = 0.05) -> dict[str, Any]:
    """``hold_document`` with Celery's own default acks (early), as most projects' tasks
    have them: plain Celery's baseline in ``bench/short_documents.py``; the router makes them late."""
    return hold(self, client_id, document_id, seconds)
