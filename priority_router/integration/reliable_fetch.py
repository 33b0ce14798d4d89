"""A worker on Redis takes each document and records it unacknowledged in one step.

kombu's Redis transport takes a message with BRPOP, which removes it from its list, and
records it in its ``unacked`` hash (``QoS.append``) only once the reply has reached the
worker's main process, in a second round trip.  Between the two the message is nowhere
but in that process or its socket: a worker SIGKILLed then loses it, late acks or not,
and kombu's sweep has nothing to put back.  A field trial lost 1 document of 113,569 that
way, and 100 SIGKILLs of a worker draining a giant client's backlog lost 1
(``bench/kill_loss.py``, docs/failure.md).

A router worker's task channel takes messages with ``lua/fetch.lua`` instead: one script
pops the most urgent message, as BRPOP would, and records it in kombu's ``unacked`` hash
and index, so from the moment it leaves its list kombu's sweep can put it back; kombu then
keeps it in the process without writing that record again.  A script
cannot block, so when every list was empty the worker waits with a BLMOVE of one list onto
itself, which moves nothing (its tail goes back where it was): it returns as soon as a
document arrives there, or after :data:`WAIT` seconds, and the worker fetches again.  It
waits on the list a document goes to when its client has nothing pending (the threshold
table's priority for 0: priority 1 by default), where documents arrive while workers are
idle; an idle worker sees a document of another priority after ``WAIT`` to twice that
(Redis ends a blocking command's wait on its ``hz`` tick).  (No Redis command waits on
several lists without taking from them.)

Where the broker refuses the script or BLMOVE (a Redis before 6.2, an ACL without
``EVAL``, ``EVALSHA`` or ``BLMOVE``, a full ``noeviction`` Redis refusing scripts), the worker takes
with kombu's BRPOP instead, says so once, and tries again :data:`RETRY` seconds later.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from queue import Empty
from typing import Any

from celery import Celery, bootsteps
from redis.exceptions import NoScriptError

from . import celery_internals
from .brokers import Transport, to_wire
from .installation import installation_of

logger = logging.getLogger("priority_router")

#: The fetch script; its KEYS and ARGV are documented at its top.
SCRIPT = (Path(__file__).parent / "lua" / "fetch.lua").read_text()
SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()
#: Most seconds an idle worker waits before it looks at every list again.
WAIT = 0.1
#: Seconds before a worker tries again a command the broker refused.
RETRY = 10.0


def watch_fetch(app: Celery) -> None:
    """Add :class:`FetchStep` to ``app``'s workers (idempotent)."""
    app.steps["consumer"].add(FetchStep)


class FetchStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """A consumer bootstep: on Redis, the task channel takes documents with a
    :class:`ReliableFetch` (at each start: a lost connection rebuilds the channel)."""

    name = "priority_router.reliable_fetch"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, parent: Any) -> None:
        installation = installation_of(parent.app)
        if installation is None or installation.engine.config.dry_run:
            return
        if installation.receiver.transport is Transport.REDIS:
            idle = to_wire(installation.engine.policy.priority_for(0), Transport.REDIS)
            ReliableFetch(celery_internals.task_channel(parent), idle).install()


class ReliableFetch:
    """One kombu Redis channel's fetch: the script while it finds documents, the wait on its
    first queue's list for ``idle_step`` after it found none; kombu's BRPOP in place of a
    command the broker refused."""

    def __init__(self, channel: Any, idle_step: int = 0, clock: Any = time.monotonic) -> None:
        self._channel = channel
        self._idle_step = idle_step
        self._clock = clock
        self._next = "fetch"
        self._sent = ""
        #: Whether the broker has the script (sent whole once, then by its SHA).
        self._loaded = False
        #: Whether the channel is reading the script's reply, and has delivered its message.
        self._taking = False
        self._delivered = False
        #: When the broker last refused each command.
        self._refused: dict[str, float] = {}

    def install(self) -> None:
        celery_internals.replace_fetch(self._channel, self.command, self.read)
        celery_internals.record_in_process(self._channel, self.recorded)

    def recorded(self, message: Any) -> bool:
        """Whether ``message`` is one the script took and recorded in kombu's unacked hash:
        kombu need not write it there again (a round trip per document)."""
        self._delivered = self._taking
        return (
            self._taking and isinstance(message.delivery_tag, str) and isinstance(message.delivery_info, dict)
        )

    def _usable(self, command: str) -> bool:
        at = self._refused.get(command)
        return at is None or self._clock() - at >= RETRY

    def command(self) -> list[Any] | None:
        lists = celery_internals.fetch_keys(self._channel, self._idle_step)
        if lists is None:
            return None
        keys, idle = lists
        wanted = self._next
        if not self._usable(wanted):
            wanted = "brpop"
        self._sent = wanted
        if wanted == "wait":
            return ["BLMOVE", idle, idle, "RIGHT", "RIGHT", WAIT]
        if wanted == "fetch":
            index, unacked = celery_internals.unacked_keys(self._channel)
            script = ["EVALSHA", SHA] if self._loaded else ["EVAL", SCRIPT]
            self._loaded = True
            return [*script, len(keys) + 2, index, unacked, *keys]
        return ["BRPOP", *keys, self._channel.brpop_timeout or 0]

    def read(self, kombu_read: Any) -> Any:
        sent, self._next, self._delivered = self._sent, "fetch", False
        try:
            if sent == "wait":
                celery_internals.read_other(self._channel, "BLMOVE")
            self._taking = sent == "fetch"
            return kombu_read()
        except Empty:
            if sent == "fetch":
                self._next = "wait"
            raise
        except NoScriptError as exc:  # the broker lost its scripts (a restart, SCRIPT FLUSH)
            self._loaded = False
            raise Empty() from exc
        except celery_internals.broker_refusal(self._channel) as exc:
            if sent == "brpop" or self._delivered:  # kombu's error, or the consumer's
                raise
            self._loaded = self._loaded and sent != "fetch"
            self._refuse(sent, exc)
            self._next = sent
            raise Empty() from exc
        finally:
            self._taking = False

    def _refuse(self, sent: str, exc: Exception) -> None:
        first = not self._refused
        self._refused[sent] = self._clock()
        if first:
            logger.warning(
                "priority-router: the broker refused the worker's %s (%s: %s); it takes documents with "
                "kombu's BRPOP meanwhile, and a worker killed between taking a document and recording it "
                "loses that document (docs/failure.md). Fix: a Redis broker of 6.2 or later whose user may "
                "run EVAL, EVALSHA and BLMOVE on the queues' keys",
                "fetch script" if sent == "fetch" else "wait (BLMOVE)",
                type(exc).__name__,
                exc,
            )
