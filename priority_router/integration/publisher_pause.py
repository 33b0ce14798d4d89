"""Publishers hold their publishes to a RabbitMQ queue while ``priority-router migrate``
swaps it for one of the other kind.

RabbitMQ cannot change the arguments of a queue, so a migration deletes the queue and
declares it again under its name.  Celery sends the tasks of a direct-exchange queue
through the default exchange, which silently drops a message for a queue that does not
exist and can be given no alternate exchange; and a kombu connection declares a queue
once, so a running publisher does not recreate it.  So while the queue is swapped, the
router's publishers hold what they publish to it.

The migrator marks the queue in one hash of the counter store, ``<prefix>rabbitmq-
migrations``: the field is ``["vhost", "queue"]`` (JSON), the value says what the queue
becomes and which exchanges route to it.  Beside each field an ``alive`` key, renewed
every second with a TTL of a few seconds, says the migrator still runs.  A publisher
reads the hash at most once every :data:`REFRESH` seconds, in the publish that finds its
copy older than that: with no migration under way that is one ``HGETALL`` per second
and publishing process, never one per publish.  A publish to a marked queue waits,
reading the mark again every :data:`POLL` seconds, until the mark goes.  A mark whose
``alive`` key has expired (the migrator was killed) or a wait longer than
:data:`HOLD_LIMIT` releases the publish with one ERROR, after declaring the queue, so
that the publish is not dropped should the queue be missing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery

from .rabbitmq import vhost_of

logger = logging.getLogger("priority_router")

#: Seconds a publisher keeps what it read of the marks.
REFRESH = 1.0
#: Seconds between two reads of the mark while a publish waits.
POLL = 0.05
#: Longest a publish waits; then it goes out, with one ERROR.
HOLD_LIMIT = 10.0
#: Milliseconds a mark stays alive unless the migrator renews it.
ALIVE_MS = 5000
#: Seconds between the migrator's renewals.
RENEW_EVERY = 1.0
#: Seconds the migrator waits after marking a queue: each publisher has read the mark by
#: then, and the publishes that had passed the check before are in the queue.
GRACE = REFRESH + 0.5
#: Milliseconds the hash lives after the last renewal of any mark in it.
HASH_TTL_MS = 60_000
#: Seconds a publisher leaves a store that failed to answer before asking it again.
FAILED_READ_PAUSE = 5.0

#: ``store()``: the counter store's client and key prefix, as the router has them now.
Store = Callable[[], "tuple[redis.Redis, str]"]


def migrations_key(prefix: str) -> str:
    """The hash of the queues being migrated under ``prefix``."""
    return f"{prefix}rabbitmq-migrations"


def mark_field(vhost: str, queue: str) -> str:
    return json.dumps([vhost, queue])


def alive_key(prefix: str, field: str) -> str:
    return f"{prefix}rabbitmq-migration-alive:{hashlib.sha1(field.encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class Mark:
    """One queue being migrated, as the hash holds it."""

    vhost: str
    queue: str
    #: What the queue becomes: "router" or "plain".
    target: str
    #: ``(exchange, routing key)`` pairs that route to the queue besides the default exchange.
    routes: frozenset[tuple[str, str]]
    #: When the migrator marked it (seconds since the epoch, the migrator's clock).
    since: float

    @property
    def field(self) -> str:
        return mark_field(self.vhost, self.queue)

    def encode(self) -> str:
        return json.dumps({"to": self.target, "routes": sorted(self.routes), "since": self.since})

    @classmethod
    def decode(cls, field: bytes | str, value: bytes | str) -> Mark | None:
        try:
            vhost, queue = json.loads(field)
            data = json.loads(value)
            routes = frozenset((str(e), str(k)) for e, k in data.get("routes", ()))
            return cls(str(vhost), str(queue), str(data.get("to", "")), routes, float(data.get("since", 0)))
        except (ValueError, TypeError, AttributeError):
            return None

    def command(self) -> str:
        return f"priority-router migrate {self.queue} --to {self.target or 'router'} -A APP"


def read_marks(client: redis.Redis, prefix: str) -> list[Mark]:
    """Every mark under ``prefix``, alive or not."""
    raw: dict[Any, Any] = client.hgetall(migrations_key(prefix))
    found = (Mark.decode(f, v) for f, v in raw.items())
    return [m for m in found if m is not None]


def alive(client: redis.Redis, prefix: str, marks: Iterable[Mark]) -> dict[str, bool]:
    """For each mark's field: whether its migrator still renews it."""
    fields = [m.field for m in marks]
    if not fields:
        return {}
    with client.pipeline(transaction=False) as pipe:
        for field in fields:
            pipe.exists(alive_key(prefix, field))
        return {f: bool(n) for f, n in zip(fields, pipe.execute(), strict=True)}


class PublishPause:
    """One app's publishers' side: :meth:`hold` is called for each publish to RabbitMQ."""

    def __init__(self, app: Celery, store: Store) -> None:
        self._app = weakref.ref(app)
        self._store = store
        self._vhost: str | None = None
        self._next_read = 0.0
        #: Marks of this vhost's queues by queue name, as last read, and whether each is alive.
        self._marks: dict[str, tuple[Mark, bool]] = {}
        self._said: set[tuple[str, float, str]] = set()

    def hold(self, exchange: object, routing_key: object, declare: object) -> None:
        """Return at once unless the publish goes to a queue being migrated; then wait."""
        now = time.monotonic()
        if now >= self._next_read:
            self._refresh(now)
        if not self._marks:
            return
        found = self._marked(exchange, routing_key, declare)
        if found is None:
            return
        mark, running = found
        if running:
            self._wait(mark)
        else:
            self._release(mark, "stale", STALE)

    def _refresh(self, now: float) -> None:
        self._next_read = now + REFRESH
        try:
            client, prefix = self._store()
            if self._vhost is None:
                app = self._app()
                if app is None:
                    return
                self._vhost = vhost_of(app)
            marks = [m for m in read_marks(client, prefix) if m.vhost == self._vhost]
            running = alive(client, prefix, marks)
        except Exception:
            logger.debug("priority-router could not read the queue migrations", exc_info=True)
            self._next_read = now + FAILED_READ_PAUSE
            self._marks = {}
            return
        self._marks = {m.queue: (m, running[m.field]) for m in marks}

    def _marked(self, exchange: object, routing_key: object, declare: object) -> tuple[Mark, bool] | None:
        name = getattr(exchange, "name", exchange) or ""
        queues = [getattr(q, "name", None) for q in declare] if isinstance(declare, list | tuple) else []
        if not name and isinstance(routing_key, str):
            queues.append(routing_key)
        for queue in queues:
            if isinstance(queue, str) and queue in self._marks:
                return self._marks[queue]
        for mark, running in self._marks.values():
            if (str(name), str(routing_key)) in mark.routes:
                return mark, running
        return None

    def _wait(self, mark: Mark) -> None:
        started = time.monotonic()
        self._say(mark, "held", logging.INFO, HELD)
        while True:
            time.sleep(POLL)
            try:
                client, prefix = self._store()
                current = {m.field: m for m in read_marks(client, prefix)}.get(mark.field)
                running = current is not None and alive(client, prefix, [current])[current.field]
            except Exception:
                logger.debug("priority-router could not read the migration of %r", mark.queue, exc_info=True)
                current, running = mark, True  # still marked, as far as this process knows
            if current is None:
                self._marks.pop(mark.queue, None)
                self._say(mark, "resumed", logging.INFO, RESUMED)
                return
            if not running:
                self._release(current, "stale", STALE)
                return
            if time.monotonic() - started >= HOLD_LIMIT:
                self._release(current, "limit", LIMIT)
                return

    def _release(self, mark: Mark, why: str, text: str) -> None:
        """Let publishes to a queue whose migration stopped (or overran) go out; the first
        time, say so and declare the queue."""
        self._marks[mark.queue] = (mark, False)
        if (mark.field, mark.since, why) not in self._said:
            self._declare(mark.queue)
            self._say(mark, why, logging.ERROR, text)

    def _declare(self, name: str) -> None:
        """Declare the queue as this app does, in case the migration stopped where it had
        none: the default exchange would drop the publish."""
        from amqp.exceptions import PreconditionFailed

        app = self._app()
        queue = app.amqp.queues.get(name) if app is not None else None
        if app is None or queue is None:
            return
        try:
            with app.connection_for_write() as conn:
                queue.bind(conn.default_channel).declare()
        except PreconditionFailed:
            pass  # it exists, as the other kind: the publish is routed
        except Exception:
            logger.debug("priority-router could not declare %r after a held publish", name, exc_info=True)

    def _say(self, mark: Mark, what: str, level: int, text: str) -> None:
        """Log ``text`` once per migration and ``what``."""
        key = (mark.field, mark.since, what)
        if key not in self._said:
            self._said.add(key)
            logger.log(level, text, mark.queue, mark.command())


HELD = "priority-router: publishes to queue %r wait while `%s` swaps it (at most " + f"{HOLD_LIMIT:g} s)"
RESUMED = "priority-router: publishes to queue %r resumed: `%s` swapped it"
STALE = (
    "priority-router: the migration of queue %r stopped before it finished; its publishes go out "
    "again (the queue was declared in case it was missing). Fix: run `%s` again to finish it"
)
LIMIT = (
    "priority-router: a publish to queue %r waited the longest allowed while `%s` ran and was sent "
    "anyway. Fix: if that migration has not finished, run it again"
)


class MigrationMark:
    """The migrator's side: marks one queue, keeps the mark alive while it runs, removes it."""

    def __init__(self, client: redis.Redis, prefix: str, mark: Mark) -> None:
        self._client = client
        self._prefix = prefix
        self.mark = mark
        self._alive = alive_key(prefix, mark.field)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def is_set(self) -> bool:
        return bool(self._client.hexists(migrations_key(self._prefix), self.mark.field))

    def set(self) -> None:
        """Mark the queue and keep renewing the mark until :meth:`remove`."""
        # Alive before marked: a publisher never takes a new mark for a killed one.
        self._client.set(self._alive, "1", px=ALIVE_MS)
        self._client.hset(migrations_key(self._prefix), self.mark.field, self.mark.encode())
        self._renew()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="priority-router-migration-mark", daemon=True)
        self._thread.start()

    def stop_renewing(self) -> None:
        """Let the mark lapse, as if the migrator had died: publishers go on within seconds."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def remove(self) -> bool:
        """Remove the mark (this migration's or a killed one's); True when there was one."""
        self.stop_renewing()
        # Two keys that may live on two Redis Cluster masters: no transaction.
        with self._client.pipeline(transaction=False) as pipe:
            pipe.hdel(migrations_key(self._prefix), self.mark.field)
            pipe.delete(self._alive)
            removed, _ = pipe.execute()
        return bool(removed)

    def _renew(self) -> None:
        self._client.set(self._alive, "1", px=ALIVE_MS)
        # A killed migration's mark goes with the hash once no migrator renews it.
        self._client.pexpire(migrations_key(self._prefix), HASH_TTL_MS)

    def _run(self) -> None:
        while not self._stop.wait(RENEW_EVERY):
            try:
                self._renew()
            except Exception:
                logger.warning(
                    "priority-router could not renew the mark of %r", self.mark.queue, exc_info=True
                )
