"""RabbitMQ queues that can honour priorities, and the checks that say when one cannot.

RabbitMQ ignores message priorities on a queue declared without ``x-max-priority``,
and refuses to redeclare an existing queue with other arguments
(``PRECONDITION_FAILED``).  A worker that ignored that would serve FIFO silently.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shlex
from collections.abc import Iterable, Iterator
from typing import Any

from celery import Celery
from celery import __version__ as celery_version
from celery.app.defaults import DEFAULTS as CELERY_DEFAULTS

from ..errors import ConfigurationError
from .brokers import AMQP_MAX_PRIORITY

logger = logging.getLogger("priority_router")


class QueueNotPriorityError(ConfigurationError):
    """Existing RabbitMQ queues were declared without ``x-max-priority``."""

    def __init__(
        self, queues: str | list[str], detail: str, vhost: str = "/", other_type: bool = False
    ) -> None:
        names = [queues] if isinstance(queues, str) else list(queues)
        shown = ", ".join(repr(q) for q in names)
        they = "it already exists" if len(names) == 1 else "they already exist"
        exists = f"{they} on RabbitMQ (vhost {vhost!r})"
        #: The queue exists as another type (classic or quorum) than the app declares: no
        #: question of priorities, RabbitMQ refuses the declaration itself.
        self.other_type = other_type
        if other_type:
            problem = (
                f"{exists} as another queue type than this app declares, so RabbitMQ refuses this "
                f"app's declaration ({detail})"
            )
            fix = (
                "declare it as it exists (a classic queue gets x-max-priority from install(); a quorum "
                "queue takes x-queue-type: quorum), or move its documents to a queue of the type you "
                "want (the Brokers page of the docs, 'From a quorum queue to a priority queue')"
            )
        else:
            problem = (
                f"{exists} with other arguments than x-max-priority={AMQP_MAX_PRIORITY}, so RabbitMQ "
                f"cannot apply priorities to {'it' if len(names) == 1 else 'them'} ({detail})"
            )
            fix = drain_and_delete(names, vhost)
        super().__init__(f"queue {shown}" if len(names) == 1 else f"queues {shown}", problem, fix)
        self.queue = names[0]
        self.queues = names
        self.vhost = vhost


def drain_and_delete(queues: list[str], vhost: str) -> str:
    """The fix for FIFO queues in the way, as commands for the right vhost: the migration
    that keeps publishers running first, then the manual way, checked first."""
    p = shlex.quote(vhost)
    migrations = "; ".join(f"priority-router migrate {shlex.quote(q)} --to router -A APP" for q in queues)
    deletes = "; ".join(f"rabbitmqctl delete_queue -p {p} {shlex.quote(q)}" for q in queues)
    return (
        f"turn it into a priority queue while publishers run ({migrations}, with the app that has the "
        "router installed: it moves what waits and loses nothing); or by hand: "
        f"check that nothing waits in it (rabbitmqctl list_queues -p {p} name messages "
        f"messages_unacknowledged consumers: 0 messages and 0 unacknowledged), stop its consumers, "
        f"then delete it ({deletes}) so it is redeclared as a priority queue; or route documents to "
        f"a new queue name (task_default_queue, task_queues or task_routes). A quorum queue cannot "
        "be turned into a priority queue: see the Brokers page of the docs, 'From a quorum queue to "
        "a priority queue'"
    )


def vhost_of(app: Celery) -> str:
    """The virtual host of the app's broker URL (no connection is made)."""
    with app.connection_for_write() as conn:
        return str(conn.virtual_host or "/")


def quorum_queues_are(names: list[str]) -> str:
    """``queue 'a' is a quorum queue`` or ``queues a, b are quorum queues``."""
    if len(names) == 1:
        return f"queue {names[0]!r} is a quorum queue"
    return f"queues {', '.join(names)} are quorum queues"


def is_quorum(queue: Any) -> bool:
    return (getattr(queue, "queue_arguments", None) or {}).get("x-queue-type") == "quorum"


def queue_type_setting(conf: Any, key: str) -> Any:
    """``conf[key]`` for a setting of some Celery releases only, None where this one has none
    (``task_default_queue_type`` is Celery 5.5's, ``task_create_missing_queue_type`` 5.6's):
    an older Celery ignores it and declares classic queues."""
    return conf.get(key) if key in CELERY_DEFAULTS else None


def uses_quorum_queues(app: Celery) -> bool:
    """Whether any queue the app declares, or creates on demand, is a quorum queue."""
    conf = app.conf
    settings = ("task_default_queue_type", "task_create_missing_queue_type")
    if "quorum" in (queue_type_setting(conf, key) for key in settings):
        return True
    declared = conf.task_queues or ()
    built = app.amqp.__dict__.get("queues")
    return any(is_quorum(q) for q in (*declared, *(built.values() if built else ())))


def declared_queues(app: Celery) -> list[Any]:
    """The app's queues: those Celery built, or those it will build from ``task_queues``."""
    built = app.amqp.__dict__.get("queues")
    return list(built.values()) if built is not None else list(app.conf.task_queues or ())


def quorum_queue_names(app: Celery) -> list[str]:
    """The names of the app's quorum queues, including a default queue not built yet."""
    names = [q.name for q in declared_queues(app) if is_quorum(q)]
    default_type = queue_type_setting(app.conf, "task_default_queue_type")
    if default_type == "quorum" and app.amqp.__dict__.get("queues") is None:
        names.append(app.conf.task_default_queue)
    return sorted(set(names))


#: What quorum queues do with message priorities, by RabbitMQ version.
QUORUM_PRIORITIES = (
    "RabbitMQ quorum queues honour priorities from 4.0 on: 4.0-4.2 know two levels (wire "
    "values above 4 are high, so logical priorities 1-5 go before 6-9, about 2:1 rather than "
    "strictly); 4.3 and later serve levels 0-31 strictly, so all nine levels take effect. "
    "Before 4.0 quorum queues ignore priorities"
)


def quorum_note(version: tuple[int, ...] | None) -> tuple[bool, str]:
    """(priorities work at all, what the user gets) for quorum queues on ``version``."""
    if version is None:
        return True, QUORUM_PRIORITIES
    shown = ".".join(map(str, version))
    if version < (4, 0):
        return False, (
            f"RabbitMQ {shown} serves quorum queues in arrival order: they have no priorities "
            "before RabbitMQ 4.0, so the router's priorities take no effect there"
        )
    if version < (4, 3):
        return True, (
            f"RabbitMQ {shown}: quorum queues know two priority levels; logical priorities 1-5 "
            "are served before 6-9 (about 2:1, not strictly)"
        )
    return True, f"RabbitMQ {shown}: quorum queues serve all nine levels strictly"


#: Why a worker that asks for a global QoS cannot consume a quorum queue, and the fix.
QUORUM_WITHOUT_DETECTION = (
    f"Celery {celery_version}'s worker asks RabbitMQ for a global QoS, which quorum queues refuse "
    "(NOT_IMPLEMENTED ... does not support global qos), so it reconnects again and again without "
    "consuming them, with or without the router"
)
QUORUM_DETECTION_FIX = (
    "Celery 5.6 or later with worker_detect_quorum_queues on (its default), or classic queues"
)


def celery_consumes_quorum(conf: Any) -> bool:
    """Whether this Celery's workers, so configured, can consume quorum queues (Celery
    before 5.5 has no ``worker_detect_quorum_queues`` and always asks for a global QoS)."""
    return bool(queue_type_setting(conf, "worker_detect_quorum_queues"))


def classic_fix(app: Celery) -> str:
    """How to make the app's quorum queues classic, in this Celery's terms."""
    if queue_type_setting(app.conf, "task_default_queue_type") == "quorum":
        return "use classic queues (task_default_queue_type='classic')"
    return "declare these queues as classic ones (without x-queue-type: quorum)"


def server_version(conn: Any) -> tuple[int, ...] | None:
    """The RabbitMQ version an open kombu connection reports, if it does."""
    props = getattr(getattr(conn, "connection", None), "server_properties", None) or {}
    raw = props.get("version")
    if isinstance(raw, bytes):
        raw = raw.decode(errors="replace")
    if not isinstance(raw, str):
        return None
    digits = re.findall(r"\d+", raw)[:3]
    return tuple(int(d) for d in digits) or None


_INEQUIVALENT = re.compile(r"inequivalent arg 'x-max-priority' for queue '(?P<queue>.*?)' in vhost")
_demoted: set[tuple[int, str]] = set()


def fifo_queue_in(exc: BaseException) -> str | None:
    """The queue name when ``exc`` is RabbitMQ refusing to add ``x-max-priority`` to it."""
    from amqp.exceptions import PreconditionFailed

    if not isinstance(exc, PreconditionFailed):
        return None
    match = _INEQUIVALENT.search(str(exc))
    return match.group("queue") if match else None


def demote_to_fifo(app: Celery, queue_name: str) -> bool:
    """Declare ``queue_name`` as it exists (no ``x-max-priority``) from now on, so
    publishing to it keeps working; say once, loudly, that it serves FIFO.  False when
    no declaration of this app's can publish to it: the app declares a quorum queue where
    a classic one exists (said once, loudly).

    A queue this app already declares without ``x-max-priority`` is refused for the other
    reason: it has become a priority queue since (``priority-router migrate --to
    router``), so the app declares it with ``x-max-priority`` again."""
    queue = app.amqp.queues.get(queue_name)
    if queue is not None and is_quorum(queue):
        if (id(app), queue_name) not in _demoted:
            _demoted.add((id(app), queue_name))
            detail = "PRECONDITION_FAILED on publish: a classic priority queue, declared here as quorum"
            logger.error(
                "priority-router: %s. Its publishes fail until then, as they would without the router",
                QueueNotPriorityError(queue_name, detail, vhost_of(app), other_type=True),
            )
        return False
    if queue is not None:
        if _declared_plain(queue):
            _declare_as_priority_queue(queue)
            _demoted.discard((id(app), queue_name))
            logger.info(
                "priority-router: queue %r is a priority queue again; its documents are served by "
                "priority from now on",
                queue_name,
            )
            return True
        args = dict(queue.queue_arguments or {})
        args.pop("x-max-priority", None)
        queue.queue_arguments = args or None
        queue.max_priority = None
    if (id(app), queue_name) not in _demoted:
        _demoted.add((id(app), queue_name))
        logger.error(
            "priority-router: %s. Until then documents published to it are delivered "
            "without priority ordering (workers installed with the router refuse to consume it)",
            QueueNotPriorityError(queue_name, "PRECONDITION_FAILED on publish", vhost_of(app)),
        )
    return True


def follow_priority_queue(app: Celery, queue_name: str) -> bool:
    """A router in dry run: declare ``queue_name`` with ``x-max-priority`` from now on when
    the app declares it plain and RabbitMQ refused that, since a router switched on made it
    a priority queue (said once); False for any other refusal, which fails as in plain
    Celery."""
    queue = app.amqp.queues.get(queue_name)
    if queue is None or is_quorum(queue) or not _declared_plain(queue):
        return False
    _declare_as_priority_queue(queue)
    logger.warning(
        "priority-router dry run: queue %r is a priority queue on RabbitMQ (a router switched on "
        "made it one) and refuses plain Celery's declaration, so this app declares it with "
        "x-max-priority=%d from now on; its dry-run documents carry plain Celery's priority",
        queue_name,
        AMQP_MAX_PRIORITY,
    )
    return True


def _declared_plain(queue: Any) -> bool:
    return "x-max-priority" not in (queue.queue_arguments or {}) and queue.max_priority is None


def _declare_as_priority_queue(queue: Any) -> None:
    queue.queue_arguments = {**(queue.queue_arguments or {}), "x-max-priority": AMQP_MAX_PRIORITY}


def verify_priority_queues(
    app: Celery, create: bool = True, queues: Iterable[Any] | None = None
) -> list[str]:
    """Declare each queue the app uses (or ``queues``); raise :class:`QueueNotPriorityError`
    naming those that exist without matching priority arguments.  Returns the queue names
    checked.

    With ``create=False`` a queue that does not exist yet is left uncreated (and unlisted).
    """
    from amqp.exceptions import NotFound, PreconditionFailed

    checked, refused, detail, other_type = [], [], "", False
    with app.connection_for_write() as conn:
        vhost = str(conn.virtual_host or "/")
        for queue in app.amqp.queues.values() if queues is None else queues:
            if not create:
                with channel_of(conn) as channel:
                    try:
                        channel.queue_declare(queue=queue.name, passive=True)
                    except NotFound:
                        continue
            with channel_of(conn) as channel:
                try:
                    queue.bind(channel).declare()
                except PreconditionFailed as exc:
                    refused.append(queue.name)
                    detail = detail or str(exc)
                    # RabbitMQ names the first argument that differs, often x-max-priority.
                    other_type = other_type or is_quorum(queue) or "'x-queue-type'" in str(exc)
                    continue
            checked.append(queue.name)
    if refused:
        raise QueueNotPriorityError(refused, detail, vhost, other_type)
    return checked


def rabbitmq_version(app: Celery) -> tuple[int, ...] | None:
    """The version of the RabbitMQ the app writes to (connects once)."""
    with app.connection_for_write() as conn:
        conn.connect()
        return server_version(conn)


def follow_priority_queues(app: Celery) -> None:
    """At a worker's start in dry run: each queue it consumes that a router switched on
    made a priority queue is declared as it exists (:func:`follow_priority_queue`), since
    RabbitMQ refuses plain Celery's declaration of it and the worker would stop on that."""
    from amqp.exceptions import PreconditionFailed

    with app.connection_for_write() as conn:
        for queue in list(app.amqp.queues.consume_from.values()):
            with channel_of(conn) as channel:
                try:
                    queue.bind(channel).declare()
                except PreconditionFailed as exc:
                    if fifo_queue_in(exc) == queue.name:
                        follow_priority_queue(app, queue.name)


@contextlib.contextmanager
def channel_of(conn: Any) -> Iterator[Any]:
    """A channel of its own on ``conn`` for one step: a refused declaration closes the channel
    it was made on, so closing it again at the end may fail, and that is no error."""
    channel = conn.channel()
    try:
        yield channel
    finally:
        with contextlib.suppress(Exception):
            channel.close()


def check_worker_queues(app: Celery) -> None:
    """At worker start: refuse a queue this worker consumes (``-Q``) that RabbitMQ would
    serve in arrival order, and say what its quorum queues do with priorities here."""
    # After -Q (the worker selects its queues before worker_init), the queues it consumes.
    consumed = list(app.amqp.queues.consume_from.values())
    try:
        verify_priority_queues(app, queues=consumed)
    except QueueNotPriorityError as exc:
        logger.critical("priority-router: %s", exc)
        # Signal receivers' exceptions are only logged by Celery; SystemExit is not.
        shown = ("s " if len(exc.queues) > 1 else " ") + ", ".join(repr(q) for q in exc.queues)
        raise SystemExit(
            "priority-router: the worker refuses to start: "
            + (
                f"RabbitMQ refuses this app's declaration of the queue{shown}"
                if exc.other_type
                else f"RabbitMQ would serve the queue{shown} in arrival order"
            )
            + " (the priority-router line above says why and how to fix it)"
        ) from None
    quorum = sorted(q.name for q in consumed if is_quorum(q))
    if not quorum:
        return
    version = rabbitmq_version(app)
    honoured, note = quorum_note(version)
    if honoured:
        logger.warning("priority-router: %s. %s", quorum_queues_are(quorum), note)
    else:
        logger.warning(
            "priority-router: %s and %s. Fix: upgrade to RabbitMQ 4.0 or later, or %s",
            quorum_queues_are(quorum),
            note,
            classic_fix(app),
        )
    if not celery_consumes_quorum(app.conf):
        logger.critical(
            "priority-router: queues %s: %s. Fix: %s",
            ", ".join(quorum),
            QUORUM_WITHOUT_DETECTION,
            QUORUM_DETECTION_FIX,
        )
