"""Adopting the documents an older release's gate held in the counter store (docs/lifecycle.md).

Builds that reported 0.1.0, up to b0b0e69, held a document by storing its message in the
counter store (``<prefix>{<client>}:msg``); this release holds documents in the broker and
never reads that hash.  Each worker's gate thread looks for such hashes at its start and
every :data:`ADOPT_EVERY` seconds after (older workers may still be holding during a rolling
upgrade), and puts every document found back in the broker's custody: in its client's
holding queue when the client still has limits (counted held, and released as this
release's own), else back where it was first published.  Each is published first and
forgotten in the store after, so a worker killed in between leaves it to be published again:
at least once, as Celery runs a document whose worker was killed.

The stored form (b0b0e69's ``integration/redeliver.py``) is JSON: the body in base64, still
serialized as it came, its content type and encoding, the headers, the properties priority,
correlation id, reply-to and delivery mode, and the exchange and routing key it was first
published to.  It is published again unchanged: same task id, headers and priority.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
from typing import TYPE_CHECKING, Any

import redis

from ..redact import redact_url
from ..store.client_ids import normalize_client_id
from ..store.old_held import OldHeld
from ..store.permissions import acl_user, refusal
from .holding import SENT_PROPERTIES, Document

if TYPE_CHECKING:
    from .gate import Gate

logger = logging.getLogger("priority_router")

#: Seconds between a worker's looks for an older release's held documents.
ADOPT_EVERY = 60.0


class Unreadable(ValueError):
    """A stored message that is not in the older release's form."""


def unpack(packed: bytes) -> Document:
    """The document of a message the older release stored; :class:`Unreadable` otherwise."""
    try:
        stored = json.loads(packed)
        body = base64.b64decode(stored["body"], validate=True)
        headers = stored["headers"]
        properties = stored.get("properties") or {}
        document = Document(
            body,
            dict(headers),
            stored.get("content_type"),
            stored.get("content_encoding"),
            str(stored.get("exchange") or ""),
            str(stored.get("routing_key") or ""),
            {k: properties[k] for k in SENT_PROPERTIES if properties.get(k) is not None},
        )
    except (ValueError, TypeError, KeyError, AttributeError, binascii.Error) as exc:
        raise Unreadable(f"{type(exc).__name__}: {exc}") from None
    return document


class Adopter:
    """One process's adoption of an older release's held documents, for one gate."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.old = OldHeld(gate.router.redis, gate.router.config.key_prefix)
        self._unreadable: set[str] = set()
        #: Whether the last look found a client whose documents another worker adopts (or
        #: one killed while adopting them: its lock runs out within seconds).
        self.locked = False
        #: Whether the store refused the adoption's commands to its user (said once).
        self.refused = False

    def adopt(self) -> int:
        """Adopt every document found; how many were put back in the broker's custody.
        Raises what the store or the broker raised (the gate thread says so, and retries),
        but a refusal of the store's user: that one is said once, and the gate goes on."""
        self.locked = False
        if self.refused:
            return 0
        try:
            return sum(self._adopt(base) for base in list(self.old.bases()))
        except redis.ResponseError as exc:
            refused = refusal(exc)
            if refused is None:
                raise
            self.refused = True
            config = self.gate.router.config
            logger.error(
                "priority-router: the counter store at %s refuses %s to its Redis user (%s), so this worker "
                "cannot look for documents that workers of an older release held in the store; they wait "
                "there until a worker adopts them (`priority-router status` names them). Fix: %s, then "
                "restart the worker",
                redact_url(config.redis_url),
                refused.problem(),
                refused.said,
                refused.fix(acl_user(config.redis_url), config.key_prefix),
            )
            return 0

    def _adopt(self, base: str) -> int:
        client = self.old.client_of(base) or self._client_in(base)
        if client is None:
            return 0
        limits = self.gate.router.limit_store.snapshot().of(client)
        moved = 0
        try:
            while True:
                claimed = self.old.claim(base, bool(limits), int(time.time() * 1000))
                if claimed is None:
                    self.locked = True  # another worker adopts this client's now
                    return moved
                fresh = [
                    (task_id, message) for task_id, message in claimed if task_id not in self._unreadable
                ]
                if not fresh:
                    break
                for task_id, message in fresh:
                    try:
                        document = unpack(message)
                    except Unreadable as exc:
                        self._unreadable.add(task_id)
                        logger.error(
                            "priority-router: document %s of client %r, held by an older release in the "
                            "counter store, cannot be read (%s); it stays in %s:adopting. Fix: publish it "
                            "again by hand, then delete it there",
                            task_id,
                            client,
                            exc,
                            base,
                        )
                        continue
                    if limits:
                        self.gate.holding.hold_document(document, task_id, client, first=moved == 0)
                    else:
                        self.gate.holding.send_document(document)
                    # Published first: a kill here publishes it again (at least once).
                    self.old.done(base, task_id)
                    moved += 1
        finally:
            if moved:
                self._said(client, moved, bool(limits))
        self.old.unlock(base)
        if moved and limits:
            store = self.gate.store
            store.note_held(client, store.end(client, "", limits))
        return moved

    def _client_in(self, base: str) -> str | None:
        """The client id of a hashed key, from a message's headers."""
        sample = self.old.sample(base)
        if sample is None:
            return None
        try:
            headers: Any = json.loads(sample).get("headers") or {}
        except (ValueError, AttributeError):
            return None
        return normalize_client_id(headers.get(self.gate.router.config.client_id_header))

    def _said(self, client: str, moved: int, limited: bool) -> None:
        logger.warning(
            "priority-router: adopted %d document(s) of client %r that a worker of an older release held "
            "in the counter store: %s. Older workers still running hold documents there until they are "
            "replaced (docs/lifecycle.md)",
            moved,
            client,
            "they wait in its holding queue on the broker, released as its limits allow"
            if limited
            else "it has no limits now, so they went back to their queue",
        )
