"""Documents stranded in Redis priority lists that no worker polls, seen by their publisher.

On the Redis broker each queue is ten lists, one a priority step; a worker BRPOPs the
lists of its ``priority_steps``, most urgent first.  The router publishes to all ten.  A
worker whose app runs without the router polls kombu's default steps 0, 3, 6 and 9 only,
so documents at 1, 2, 4, 5, 7 and 8 wait in lists it never reads, forever, and nothing
fails.  No broadcast is needed to see it: a publisher that the router runs in looks, every
:data:`LOOK_INTERVAL` seconds while it publishes, at the lists of the queues it published
to (one read-only script per queue, ``lua/list_tails.lua``: each list's length and oldest
document) and judges them with :class:`Judge`.

A list is *skipped* at a look when its oldest document was there while a worker took a
younger document from a less urgent list of the same queue; a worker polling the list
would have taken its document first.  Either of two things shows it:

- this process published to a less urgent list after that oldest document was published,
  and the less urgent list is empty now: a worker took what this process put there;
- the less urgent list's oldest document at the last look, no older than this list's, is
  gone, while this list kept its oldest document.

A list skipped at two looks in a row with the same oldest document is *stranded*: one
WARNING per queue names its lists and the fix, until every one of them has lost that
document (a worker takes from it again), which one INFO says.  A draining backlog is never
skipped (the worker takes a list's oldest document before any less urgent one), nor are
lists when the workers are all busy or down (nothing is taken from any list).  A document
that came back to its list after a worker took it (kombu's restore marks it
``redelivered``; the gate's release, ``priority_router_gated``) may be older than its time
in the list, so its age shows nothing.  The queue's own list (step 0) is polled by every
worker and never judged.  ``max_wait`` moves the oldest overdue documents first, so a
document it moved is never younger than one it left.  RabbitMQ has one queue per name and
no lists: the watch runs on Redis only.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import redis
from celery import Celery

from .. import headers as H
from ..forks import renew_after_fork
from .celery_internals import priority_list
from .starvation import close_quietly, queue_lists

logger = logging.getLogger("priority_router")

#: The look script; its KEYS, ARGV and reply are documented at its top.
SCRIPT = (Path(__file__).parent / "lua" / "list_tails.lua").read_text()

#: Seconds between a publishing process's looks at the lists it published to.  A list is
#: stranded after two looks, so a blind worker is named within two intervals of the first
#: look that sees it (and within a minute of the first publish).
LOOK_INTERVAL = 15.0
#: Seconds from a process's first publish to its first look.
FIRST_LOOK = 5.0
#: Seconds without a publish after which a process stops looking (while nothing it said is
#: stranded); its next publish starts the looks again.
IDLE_AFTER = 4 * LOOK_INTERVAL

#: What to do about documents stranded in priority lists.
FIX = (
    "install the router in the app of the workers consuming that queue too "
    "(PriorityRouter(...).install(app) where the worker's Celery app is created, with dry run "
    "off: PRIORITY_ROUTER_DRY_RUN in that worker's environment), or set "
    "broker_transport_options['priority_steps'] = list(range(10)) in that app, then restart "
    "those workers; the documents waiting are taken once they poll every list"
)


@dataclass(frozen=True)
class ListState:
    """One priority list at one look."""

    key: str
    length: int
    #: The delivery tag of its oldest document; "" when empty or unreadable.
    tail: str
    #: When its oldest document was published (Unix seconds), None when it does not say.
    published_at: float | None
    #: Whether its oldest document came back after a worker took it (kombu's restore, the
    #: gate's release): it may have been in the list for less than its age.
    put_back: bool


def skipped(
    now: Sequence[ListState], before: Sequence[ListState] | None, pushed: Mapping[str, float]
) -> dict[int, str]:
    """The lists of one queue (``now``, most urgent first) that a worker skipped, by index,
    each with its oldest document; ``before`` is the last look (None: none), ``pushed``
    when this process last published to each list, by key."""
    found: dict[int, str] = {}
    # The queue's own list (step 0) is one every worker polls, and where max_wait moves
    # overdue documents: it is never judged.
    for i, lst in enumerate(now):
        at = lst.published_at
        if i == 0 or not lst.length or not lst.tail or at is None:
            continue
        later = range(i + 1, len(now))
        if not lst.put_back and any(now[j].length == 0 and pushed.get(now[j].key, 0.0) > at for j in later):
            found[i] = lst.tail
            continue
        if before is None or len(before) != len(now) or before[i].tail != lst.tail:
            continue
        if before[i].put_back != lst.put_back:
            continue  # taken and put back between the looks: the list may have been empty
        for j in later:
            gone = before[j]
            if not gone.tail or now[j].tail == gone.tail or now[j].put_back:
                continue
            if gone.published_at is None or gone.published_at >= at:
                found[i] = lst.tail
                break
    return found


class Judge:
    """What a publisher concludes from its looks at its queues' lists: which are stranded,
    said once per queue while they stay so."""

    def __init__(self) -> None:
        self._last: dict[str, list[ListState]] = {}
        self._skipped: dict[str, dict[int, str]] = {}
        #: The stranded lists of each queue already said, with their oldest documents.
        self.stranded: dict[str, dict[int, str]] = {}

    def look(self, queue: str, now: list[ListState], pushed: Mapping[str, float]) -> None:
        """Judge one look at ``queue``'s lists and say what changed."""
        found = skipped(now, self._last.get(queue), pushed)
        before = self._skipped.get(queue, {})
        self._last[queue], self._skipped[queue] = now, found
        said = self.stranded.get(queue, {})
        # A stranded list stays so until its oldest document is taken.
        kept = {i: tail for i, tail in said.items() if i < len(now) and now[i].tail == tail}
        new = {i: tail for i, tail in found.items() if before.get(i) == tail and i not in kept}
        if new and not kept:
            _warn(queue, [now[i] for i in sorted(new)])
        if kept or new:
            self.stranded[queue] = {**kept, **new}
        elif said:
            del self.stranded[queue]
            logger.info(
                "priority-router: the documents said stranded in queue %r's priority lists %s have left "
                "them (a worker takes from those lists again, or they were moved or purged)",
                queue,
                ", ".join(repr(now[i].key) if i < len(now) else str(i) for i in sorted(said)),
            )


def _warn(queue: str, lists: list[ListState]) -> None:
    oldest = min((s.published_at for s in lists if s.published_at is not None), default=None)
    waited = "" if oldest is None else f" (the oldest for {max(0.0, time.time() - oldest):.0f} s)"
    logger.warning(
        "priority-router: %d document(s) of queue %r wait in priority lists no worker takes from: "
        "%s%s, while workers take younger documents from the queue's less urgent lists. The "
        "workers consuming %r do not poll these lists (a worker whose app has no priority-router "
        "installed polls only kombu's default priority steps 0, 3, 6 and 9), so these documents "
        "never run. Fix: %s",
        sum(s.length for s in lists),
        queue,
        ", ".join(f"{s.key!r} ({s.length})" for s in lists),
        waited,
        queue,
        FIX,
    )


def read_lists(script: Any, keys: list[str]) -> list[ListState]:
    """One look at the lists ``keys`` (one queue's, most urgent first): one script call."""
    found = []
    for key, (length, tail, at, put_back) in zip(
        keys, script(keys=keys, args=[H.PUBLISHED_AT, H.GATED]), strict=True
    ):
        text = at.decode() if isinstance(at, bytes) else str(at)
        try:
            published_at: float | None = float(text) if text else None
        except ValueError:
            published_at = None
        tag = tail.decode(errors="replace") if isinstance(tail, bytes) else str(tail)
        found.append(ListState(key, int(length), tag, published_at, bool(put_back)))
    return found


class Publishing(Protocol):
    """What the watch reads of a publisher (``publish.PublishReceiver``)."""

    dry_run: bool


class StrandedWatch:
    """A publishing process's looks at the priority lists it published to (Redis only),
    every :data:`LOOK_INTERVAL` seconds while it publishes, on a daemon thread: a dict write
    per publish, one script call per queue per look."""

    def __init__(self, app: Celery, receiver: Publishing) -> None:
        self._app = weakref.ref(app)
        self._receiver = receiver
        #: When this process last published to each (queue, wire priority).
        self.pushed: dict[tuple[str, int], float] = {}
        self.judge = Judge()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._connection: Any = None
        self._channel: Any = None
        self._script: Any = None
        self._refused = False
        #: How many looks this process took.
        self.looks = 0
        renew_after_fork(self)

    def published(self, queue: str, wire: object) -> None:
        """Note a publish to ``queue`` at ``wire`` (the message's priority); starts the looks
        in this process on first use."""
        key = (queue, wire if isinstance(wire, int) else 0)
        _noted.set((self, key, self.pushed.get(key)))
        self.pushed[key] = time.time()
        if self._thread is None:
            self._start()

    def after_fork(self) -> None:
        # Threads and connections do not survive fork; a forked publisher starts its own.
        self._thread = None
        self._connection = self._channel = self._script = None
        self.pushed = {}
        self.judge = Judge()

    def _start(self) -> None:
        with _start_lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._run, name="priority-router-stranded", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._close()

    def _run(self) -> None:
        delay = FIRST_LOOK
        while not self._stop.wait(delay):
            delay = LOOK_INTERVAL
            if self._idle():
                with _start_lock:
                    self._thread = None
                self._close()
                if not self._idle():  # a publish while it stopped: start again
                    self._start()
                return
            try:
                self.look()
            except redis.exceptions.NoPermissionError as exc:
                self._close()
                if not self._refused:
                    self._refused = True
                    logger.warning(
                        "priority-router cannot look at the broker's priority lists for documents "
                        "no worker takes (%s), so it cannot say when workers skip some. Fix: let the "
                        "broker's Redis user run scripts (ACL SETUSER <user> +@scripting)",
                        exc,
                    )
            except Exception:
                # The publishes themselves say when the broker fails.
                self._close()
                logger.debug("priority-router could not look at the priority lists", exc_info=True)

    def _idle(self) -> bool:
        last = max(self.pushed.values(), default=0.0)
        return time.time() - last > IDLE_AFTER and not self.judge.stranded

    def look(self) -> None:
        """One look at every queue this process published to."""
        app = self._app()
        if app is None or self._stop.is_set() or self._receiver.dry_run:
            return
        if self._script is None:
            # A connection of its own: kombu's channel knows the broker URL, TLS, Sentinel,
            # the priority steps and the key prefix of the lists.
            self._connection = app.connection_for_write()
            self._connection.ensure_connection(max_retries=1)
            self._channel = self._connection.channel()
            self._script = redis.Redis(connection_pool=self._channel.pool).register_script(SCRIPT)
        channel = self._channel
        pushed: dict[str, float] = {}
        for (queue, wire), at in list(self.pushed.items()):
            key = (channel.global_keyprefix or "") + priority_list(channel, queue, max(0, min(wire, 9)))
            pushed[key] = max(at, pushed.get(key, 0.0))
        for queue in sorted({queue for queue, _ in list(self.pushed)}):
            keys = queue_lists(channel, queue)
            self.judge.look(queue, read_lists(self._script, keys), pushed)
        self.looks += 1

    def _close(self) -> None:
        connection, self._connection = self._connection, None
        channel, self._channel = self._channel, None
        self._script = None
        close_quietly(connection, channel, "the stranded watch's")


def unsent() -> None:
    """The publish just noted raised (the broker refused it): forget it, since no worker can
    have taken it from its list."""
    noted = _noted.get()
    if noted is None:
        return
    _noted.set(None)
    watch, key, previous = noted
    if previous is None:
        watch.pushed.pop(key, None)
    else:
        watch.pushed[key] = previous


#: The last publish noted in this context (the watch, its list, the time it replaced), for
#: :func:`unsent`: noted before the send, which may still fail.
_noted: ContextVar[tuple[StrandedWatch, tuple[str, int], float | None] | None] = ContextVar(
    "priority_router_stranded_noted", default=None
)
_start_lock = threading.Lock()
