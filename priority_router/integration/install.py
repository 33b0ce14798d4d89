"""Installing a router on a Celery app, whatever order the app is configured in.

``install(app)`` reads nothing of the app's configuration.  The router's own
``priority_router_*`` settings, the settings priorities need, the broker transport and the
queues are worked out from the configuration the app finally has ("settling"), at each of
these moments:

- when Celery loads or reloads the configuration (``app.on_after_configure``; at once if
  the app is already configured);
- when Celery builds the app's task sender, right before its first publish;
- when a worker starts (``celeryd_init``, before the worker reads its settings, and
  ``worker_init``, for workers started from code).  A ``celery worker`` sets its log up
  later: what the router says as it starts, a refusal included, waits for
  ``celeryd_after_setup`` (before it consumes anything), so it reaches ``--logfile``; so
  does what it says while the command loads the app and reads its options (which reads
  the configuration, before ``celeryd_init``).  What keeping a setting costs is said at
  ``celeryd_init``, once the pool and the command line's settings are known.

A setting the user chose is kept and a warning names its cost, once.  In dry run no
setting is changed: one WARNING per app says what would be.  A broker the
router cannot drive is refused at once if it is known at ``install()``; when it is only
known later, the router says so once, loudly, and leaves that app's publishes alone.

``uninstall(app)`` undoes each step: after it the app publishes exactly as plain Celery
does, and nothing of the router keeps the app alive.
"""

from __future__ import annotations

import atexit
import functools
import logging
import logging.handlers
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any, NoReturn

import kombu
from celery import Celery
from celery.signals import (
    before_task_publish,
    celeryd_after_setup,
    celeryd_init,
    task_received,
    worker_init,
    worker_ready,
)

from .. import headers as H
from ..config import (
    celery_form,
    celery_key,
    celery_values,
    hide_store_password,
    unknown_celery_settings,
    unknown_env_settings,
    with_closest,
)
from ..errors import ConfigurationError
from ..redact import redact_url
from ..thresholds import table_name
from . import celery_internals, stranded
from .brokers import Transport, from_wire, transport_of
from .celery_settings import (
    DISABLED_PREFETCH,
    Change,
    apply_changes,
    describe,
    first_time,
    prefetch_disabled,
    wanted_changes,
    warn_kept,
)
from .consumers import check_at_start
from .endings import confirm_sent, end_unsent, watch_endings
from .gate import start_gate, watch_gate
from .green_restore import start_unacked_sweep
from .installation import ATTRIBUTE, Installation, installation_of
from .old_kombu import FIX, shortfalls, watch_old_kombu
from .pools import pool_of_options, pool_of_worker
from .publish import PublishReceiver, mistyped_tasks, own_tasks
from .publisher_pause import PublishPause
from .rabbitmq import (
    QUORUM_PRIORITIES,
    check_worker_queues,
    demote_to_fifo,
    follow_priority_queue,
    follow_priority_queues,
    quorum_queue_names,
    quorum_queues_are,
)
from .reliable_fetch import watch_fetch
from .sender import publishing_app, unwrap_sender, wrap_sender
from .solo_loop import watch_solo_loop
from .starvation import AMQP_FIX, AMQP_REFUSAL, start_sweeper
from .window import watch_window
from .worker import unwatch, watch_queue_wait

if TYPE_CHECKING:
    from ..engine import Engine

logger = logging.getLogger("priority_router")

_UID = "priority_router"


def _installed_on(owner: Any) -> tuple[Any, Installation | None]:
    """The app a worker, consumer or request belongs to, and its installation (None: none)."""
    app = getattr(owner, "app", None)
    return app, installation_of(app)


#: Every app with an installation, for settling one router's apps together.
_apps: weakref.WeakSet[Celery] = weakref.WeakSet()

_lock = threading.RLock()


def install(router: object, engine: Engine, app: Celery) -> PublishReceiver:
    """Install ``router`` (a ``PriorityRouter``, kept for ``installed_router``), made of
    ``engine``, on ``app``."""
    with _lock:
        existing = installation_of(app)
        if existing is not None:
            if existing.engine is engine:
                return existing.receiver
            raise ConfigurationError(
                "install",
                f"{app!r} already has another PriorityRouter installed",
                "install one router per app, or call uninstall(app) on the other first",
            )
        metrics = engine.metrics
        receiver = PublishReceiver(
            app,
            engine.decide,
            engine.config,
            settle,
            on_decision=None
            if metrics is None
            else functools.partial(metrics.record_decision, last_limit=engine.policy.thresholds[0].below),
            pause=PublishPause(app, lambda: (engine.redis, engine.config.key_prefix)),
            consumer_check_interval=engine.config.consumer_check_interval,
        )
        installation = Installation(router, engine, receiver)
        app.__dict__[ATTRIBUTE] = installation
        _apps.add(app)
        _connect_signals()
        app.on_after_configure.connect(_on_configure, weak=False, dispatch_uid=_UID)
        wrap_sender(app, settle, _redeclares, _unsent, confirm_sent)
        if metrics is not None:
            watch_queue_wait(app, metrics, engine.config.metrics_port)
        if app.configured:
            try:
                _settle(app, installation)
            except ConfigurationError:
                uninstall(engine, app)
                raise
        return receiver


def _unsent(app: Celery, message: Any) -> None:
    """A publish of ``app`` raised: neither a worker's end nor the stranded watch awaits it."""
    stranded.unsent()
    end_unsent(app, message)


def uninstall(engine: Engine, app: Celery) -> bool:
    """Undo :func:`install`; False when ``engine``'s router was not installed on ``app``."""
    with _lock:
        installation = installation_of(app)
        if installation is None or installation.engine is not engine:
            return False
        del app.__dict__[ATTRIBUTE]
        _apps.discard(app)
        if installation.receiver.consumer_watch is not None:
            installation.receiver.consumer_watch.stop()
        if installation.receiver.stranded_watch is not None:
            installation.receiver.stranded_watch.stop()
        unwatch(app)
        if installation.sweeper is not None:
            installation.sweeper.stop()
        if installation.gate is not None:
            installation.gate.stop()
        if installation.unacked_sweep is not None:
            installation.unacked_sweep.stop()
        app.on_after_configure.disconnect(dispatch_uid=_UID)
        unwrap_sender(app)
        return True


def configure_apps(engine: Engine) -> None:
    """Have every app ``engine``'s router is installed on load its configuration, if it has not yet:
    loading it settles the router on the app's ``priority_router_*`` settings (Django's
    ``CELERY_PRIORITY_ROUTER_*`` ones too), so a count, a read or a CLI command uses the
    same store as the app's publishes."""
    for app in list(_apps):
        installation = installation_of(app)
        if installation is not None and installation.engine is engine and not app.configured:
            app.conf.get("broker_url")  # the first read loads it; on_after_configure settles


def applied_settings(app: Celery) -> dict[str, object]:
    """The values the router installed on ``app`` set in its configuration, by key."""
    installation = installation_of(app)
    return dict(installation.applied) if installation is not None else {}


def settle(app: Celery) -> Transport | None:
    """Settle for the configuration ``app`` has now; None (said once) when it cannot be routed."""
    installation = installation_of(app)
    if installation is None:
        return None
    try:
        return _settle(app, installation, publisher=True)
    except ConfigurationError as exc:
        _unroutable(app, installation.receiver, exc)
        return None


def _settle(app: Celery, installation: Installation, publisher: bool = False) -> Transport:
    router, receiver, warned = installation.engine, installation.receiver, installation.warned
    if _before_worker_log():
        _hold_records()  # a `celery worker` reading its options: said once its log is set up
    try:
        _follow_settings(app, installation)
    except ConfigurationError as exc:
        installation.settings_error = exc
        raise
    installation.settings_error = None
    if not router.config.dry_run:
        watch_gate(app)  # documents over their client's limits wait, on workers
        watch_old_kombu(app)  # a threads worker's loop woken on a kombu before 5.7
        watch_window(app)  # a prefork worker on RabbitMQ takes one document ahead
        watch_solo_loop(app)  # a solo worker's loop does not sleep on its own acks
        watch_fetch(app)  # a Redis worker records each document unacked as it takes it
    watch_endings()  # the end of each counted or gated document, on workers
    typos = unknown_celery_settings(app.conf)
    if typos and first_time(warned, "typos"):
        logger.warning(
            "priority-router ignores %s: not a setting it reads. Fix: rename it to a setting of the "
            "configuration reference (docs/configuration.md), written %s",
            with_closest(typos),
            celery_form(app.conf, "<name>"),
        )
    misspelt = unknown_env_settings()
    if misspelt and first_time(warned, "env typos"):
        logger.warning(
            "priority-router ignores the environment variable %s: no such setting. Fix: rename it "
            "to a setting's variable, PRIORITY_ROUTER_<NAME> (docs/configuration.md)",
            with_closest(misspelt),
        )
    transport = transport_of(app)
    if transport is Transport.AMQP and router.config.max_wait is not None:
        refusal = ConfigurationError("max_wait", f"is not supported on RabbitMQ: {AMQP_REFUSAL}", AMQP_FIX)
        if not publisher:
            raise refusal
        # Only workers sweep: a publisher found on RabbitMQ after install() keeps routing
        # priorities, and says once that its workers will refuse to start.
        if first_time(warned, "max_wait"):
            logger.error(
                "priority-router on %r: %s Its workers refuse to start until it is fixed.", app, refusal
            )
    changes = wanted_changes(app, transport, installation.pool, installation.applied)
    if router.config.dry_run:
        _report_dry_run(app, changes, warned)
    else:
        _apply(app, installation, transport, changes)
    if transport is Transport.MEMORY and first_time(warned, "memory"):
        logger.warning("the memory:// broker has no priorities; documents are counted but run in order")
    default = app.conf.task_default_priority
    receiver.settled(transport, int(default) if str(default).isdigit() else None)
    return transport


def _follow_settings(app: Celery, installation: Installation) -> None:
    """Have the router follow the app's ``priority_router_*`` settings."""
    router = installation.engine
    settings = celery_values(app.conf)
    hide_store_password(app.conf)
    siblings = [installation_of(a) for a in list(_apps) if a is not app]
    others = [i.celery_settings for i in siblings if i is not None and i.engine is router]
    if any(other is not None and other != settings for other in others):
        if first_time(installation.warned, "clash"):
            logger.error(
                "priority-router: one router is installed on apps whose priority_router_* settings "
                "differ; it keeps those of the app it followed first, so %r is routed with "
                "settings it did not ask for. Fix: create one PriorityRouter per app",
                app,
            )
    else:
        installation.celery_settings = settings
        if router.follow(settings, functools.partial(celery_key, app.conf)):
            installation.receiver.use(router.config)


def settings_error(app: Celery) -> ConfigurationError | None:
    """Why the router installed on ``app`` cannot read the app's ``priority_router_*``
    settings (its publishes then go out as plain Celery sends them), or None.  Loads the
    app's configuration first, which settles the router on it."""
    installation = installation_of(app)
    if installation is None:
        return None
    app.conf.get("broker_url")  # the first read loads it; on_after_configure settles
    return installation.settings_error


def _apply(app: Celery, installation: Installation, transport: Transport, changes: list[Change]) -> None:
    warned = installation.warned
    installation.applied.update(apply_changes(app, changes))
    # A `celery worker` still reading its options knows neither its pool nor its command
    # line's settings (--disable-prefetch): what keeping a value costs is said at its start.
    if installation.logs_later or not _before_worker_log():
        warn_kept(changes, warned)
    if transport is Transport.AMQP:
        quorum = quorum_queue_names(app)
        # INFO here, in every process that loads the app: a worker says what its own quorum
        # queues do on its server, at WARNING (check_worker_queues), and doctor fails them.
        if quorum and first_time(warned, "quorum"):
            logger.info("priority-router: %s. %s", quorum_queues_are(quorum), QUORUM_PRIORITIES)


def _report_dry_run(app: Celery, changes: list[Change], warned: set[str]) -> None:
    # A WARNING, not an INFO: Celery workers and Python log at WARNING by default, and a
    # router left in dry run by mistake applies no priority at all.  Said once per app.
    if first_time(warned, "dry-run"):
        logger.warning(
            "priority-router dry run on %r: priorities are computed, counted and shown (message "
            "headers, Flower, metrics, CLI) but not applied: messages keep the priority plain Celery "
            "gives them and no Celery setting is changed. Switched on (dry_run=False), %s",
            app,
            describe(changes),
        )


def _redeclares(app: Celery, queue: str) -> bool:
    """Whether a publish RabbitMQ refused over ``queue``'s ``x-max-priority`` is sent again,
    the queue declared as it exists (a router in dry run only follows a priority queue)."""
    installation = installation_of(app)
    if installation is None:
        return False
    redeclare = follow_priority_queue if installation.engine.config.dry_run else demote_to_fifo
    return redeclare(app, queue)


def _unroutable(app: Celery, receiver: PublishReceiver, exc: ConfigurationError) -> None:
    message = str(exc)
    if receiver.refuse(message):
        logger.error(
            "priority-router cannot route the publishes of %r (they go out as plain Celery sends them, and a "
            "worker of this app refuses to start): %s",
            app,
            message,
        )


# -- the moments the configuration is settled ------------------------------------------


def _on_configure(sender: Celery | None = None, **_: Any) -> None:
    if sender is not None:
        settle(sender)


def _on_worker_starting(sender: Any = None, instance: Any = None, options: Any = None, **_: Any) -> None:
    app, installation = _installed_on(instance)
    if installation is not None:
        installation.logs_later = True
        _hold_records()
        installation.pool = pool_of_options(options or {}, app.conf)
        _settle_worker(app, installation)


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    app, installation = _installed_on(sender)
    if installation is None:
        return
    if installation.refusal is not None:
        return  # said, and acted on, at celeryd_after_setup
    installation.pool = pool_of_worker(sender)
    transport = _settle_worker(app, installation)
    if transport is None:
        return
    if installation.engine.config.dry_run:
        if transport is Transport.AMQP and not installation.logs_later:
            follow_priority_queues(app)
        return
    # The worker read its settings before this point (workers started from code send no
    # celeryd_init); the consumer is built from this attribute later.
    celery_internals.set_prefetch_multiplier(sender, int(app.conf.worker_prefetch_multiplier))
    if transport is Transport.AMQP and not installation.logs_later:
        check_worker_queues(app)


def _on_worker_setup(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """A ``celery worker``, its log set up and nothing consumed yet: what it could not say
    before."""
    global _worker_log_ready
    _worker_log_ready = True
    _release_records()
    app, installation = _installed_on(instance)
    if installation is None:
        return
    if installation.refusal is not None:
        _refuse(installation.refusal)
    if installation.receiver.transport is Transport.AMQP:
        if installation.engine.config.dry_run:
            follow_priority_queues(app)
        else:
            check_worker_queues(app)


def _say_started(app: Celery, installation: Installation, transport: Transport) -> None:
    """One INFO line per worker with what the router runs with, from every settings source."""
    if not first_time(installation.warned, "started"):
        return
    config, conf = installation.engine.config, app.conf
    options = conf.broker_transport_options or {}
    shown = f", max_connections={options['max_connections']}" if "max_connections" in options else ""
    if config.max_wait is not None:
        shown += f", max_wait={config.max_wait:g} s"
    pool = installation.pool
    if pool is not None and pool.green and transport is Transport.AMQP:
        shown += f", broker_heartbeat={conf.broker_heartbeat}"  # the router set it, or kept yours
    if prefetch_disabled(conf, transport):
        shown += f", worker_disable_prefetch=True ({DISABLED_PREFETCH})"
    logger.info(
        "priority-router on %r: mode=%s%s, thresholds %s, counter store %s, key prefix %r, %s broker, %s; "
        "worker_prefetch_multiplier=%s, task_acks_late=%s%s",
        app.main,
        config.mode,
        " (dry run)" if config.dry_run else "",
        table_name(config.thresholds),
        redact_url(config.redis_url),
        config.key_prefix,
        transport.value,
        installation.pool,
        conf.worker_prefetch_multiplier,
        conf.task_acks_late,
        shown,
    )
    if config.tasks:
        for pattern, name in mistyped_tasks(config.tasks, own_tasks(app)).items():
            logger.warning(
                "priority-router counts no document of task %s: the tasks setting's %r matches no task of "
                "this worker. Fix: correct the pattern (task names or globs, docs/configuration.md); an "
                "uncounted document keeps the priority plain Celery gives it",
                name,
                pattern,
            )
    lacking = shortfalls(transport, installation.pool)
    if lacking:
        logger.warning(
            "priority-router: kombu %s is older than 5.7, so this worker runs degraded: %s. For the full "
            "behaviour: %s",
            kombu.__version__,
            "; ".join(lacking),
            FIX,
        )


def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    app, installation = _installed_on(sender)
    if installation is None:
        return
    transport = installation.receiver.transport
    if transport is not None:
        _say_started(app, installation, transport)
    if installation.engine.config.dry_run:
        return
    if transport is not None:
        queues = getattr(getattr(sender, "task_consumer", None), "queues", None) or []
        check_at_start(app, transport, [q.name for q in queues], getattr(sender, "hostname", ""))
    pool = installation.pool
    if installation.gate is None:
        installation.gate = start_gate(app, installation.engine, sender, pool.concurrency if pool else 1)
    if (
        installation.unacked_sweep is None
        and transport is Transport.REDIS
        and pool is not None
        and pool.green
    ):
        installation.unacked_sweep = start_unacked_sweep(app)  # kombu's loop does not run it here
    if installation.sweeper is not None:
        return
    max_wait = installation.engine.config.max_wait
    if max_wait is not None and installation.receiver.transport is Transport.REDIS:
        installation.sweeper = start_sweeper(app, sender, max_wait)


_held: logging.handlers.BufferingHandler | None = None
#: A ``celery worker`` of this process has set its log up (``celeryd_after_setup``).
_worker_log_ready = False


def _before_worker_log() -> bool:
    """Whether this process runs a ``celery worker`` command that has not set its log up
    yet: it loads the app and reads its configuration (for its options' defaults) before
    ``celeryd_init``, and a record said then went to a bare stderr, not to ``--logfile``."""
    return not _worker_log_ready and celery_internals.in_worker_command()


def _hold_records() -> None:
    """Keep the router's log records until the starting worker's log is set up (or this
    process exits before it is: then they go where Python's logging sends them)."""
    global _held
    if _held is None:
        _held = logging.handlers.BufferingHandler(sys.maxsize)  # never full: released by hand
        logger.addHandler(_held)
        logger.propagate = False
        atexit.register(_release_records)


def _release_records() -> None:
    """Hand the kept records, with their own times, to the log the worker set up."""
    global _held
    if _held is None:
        return
    logger.removeHandler(_held)
    logger.propagate = True
    for record in _held.buffer:
        logger.handle(record)
    _held = None


def _refuse(message: str) -> NoReturn:
    logger.critical("%s", message)
    # Signal receivers' exceptions are only logged by Celery; SystemExit is not.
    raise SystemExit(message)


def _settle_worker(app: Celery, installation: Installation) -> Transport | None:
    """The worker's transport, its settings settled; None when it must not start (a
    ``celery worker`` is refused once its log is set up)."""
    installation.receiver.in_worker()
    try:
        transport = _settle(app, installation)
    except ConfigurationError as exc:
        if not installation.logs_later:
            _refuse(f"priority-router: {exc}")
        installation.refusal = f"priority-router: {exc}"
        return None
    # Says what the worker runs with (logging is set up by then), starts the max_wait sweeper.
    worker_ready.connect(_on_worker_ready, dispatch_uid=_UID)
    return transport


def _on_publish(**kwargs: Any) -> None:
    installation = installation_of(publishing_app.get())
    if installation is not None:
        installation.receiver(**kwargs)


#: What a worker says at most once about the documents it receives.
_RECEIVED_WARNINGS = frozenset({"unpriced", "dry-run publisher"})


def _on_task_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    _, installation = _installed_on(request)
    if installation is None or installation.warned.issuperset(_RECEIVED_WARNINGS):
        return
    headers = celery_internals.request_headers(request) or {}
    if H.REASON not in headers:
        if first_time(installation.warned, "unpriced"):
            _warn_unpriced(request, installation.engine.config.dry_run, installation.receiver.transport)
    elif (
        headers.get(H.DRY_RUN)
        and not installation.engine.config.dry_run
        and first_time(installation.warned, "dry-run publisher")
    ):
        _warn_dry_run_publisher(request)


def _warn_unpriced(request: Any, dry_run: bool, transport: Transport | None) -> None:
    wire = (getattr(request, "delivery_info", None) or {}).get("priority")
    logger.warning(
        "priority-router: task %s (id %s) arrived on queue %r without a priority-router decision: "
        "the process that published it has no router installed, so %s. Fix: install the router in "
        "the publishing app too (PriorityRouter(...).install(app) where that Celery app is created); "
        "until then, %s",
        getattr(request, "name", "?"),
        getattr(request, "id", "?"),
        _queue_of(request),
        unpriced_effect(transport, dry_run, wire if isinstance(wire, int) else None),
        STOPGAP,
    )


#: What a publisher without the router sets to be served among the routed priority-5 documents.
STOPGAP = (
    "publish its documents at priority 5 (task_default_priority = 5 for registered tasks, "
    "priority=5 on send_task; on Redis also broker_transport_options['priority_steps'] = "
    "list(range(10)) in that app, or kombu files priority 5 under 3), so they are served among "
    "the routed priority-5 documents"
)


def unpriced_effect(transport: Transport | None, dry_run: bool = False, wire: int | None = None) -> str:
    """What becomes of a document published without the router, on ``transport``; ``wire``
    is the message priority its publisher set, if any."""
    if dry_run:
        return "its documents are not counted and this dry run does not show them"
    if wire and transport is not None and transport is not Transport.MEMORY:
        logical = from_wire(wire, transport)
        return (
            f"its documents are not counted per client: they carry the fixed priority its publisher "
            f"set (wire {wire}, the router's priority {logical}) and are served about as routed "
            f"priority-{logical} documents are"
        )
    if transport is Transport.REDIS:
        return (
            "its documents carry no priority and land in the queue's first list, which workers "
            "poll first: they are served before every routed document, even priority 1"
        )
    if transport is Transport.AMQP:
        return (
            "its documents carry no priority, which RabbitMQ takes as the lowest: they are served "
            "after every routed document, even priority 9"
        )
    return "its documents are not counted and carry no client priority"


def _warn_dry_run_publisher(request: Any) -> None:
    logger.warning(
        "priority-router: task %s (id %s) arrived on queue %r from a publisher whose router is in "
        "dry run: it carries the priority plain Celery gives it, not the router's, so it is served "
        "out of turn with the routed documents. Fix: switch the publishers' router on too "
        "(dry_run=False)",
        getattr(request, "name", "?"),
        getattr(request, "id", "?"),
        _queue_of(request),
    )


def _queue_of(request: Any) -> object:
    return (getattr(request, "delivery_info", None) or {}).get("routing_key")


_connected = False


def _connect_signals() -> None:
    # Module-level receivers, connected once: they hold no app or router, so neither is
    # kept alive by Celery's process-wide signals.
    global _connected
    if _connected:
        return
    before_task_publish.connect(_on_publish, dispatch_uid=_UID)
    celeryd_init.connect(_on_worker_starting, dispatch_uid=_UID)
    worker_init.connect(_on_worker_init, dispatch_uid=_UID)
    celeryd_after_setup.connect(_on_worker_setup, dispatch_uid=_UID)
    task_received.connect(_on_task_received, dispatch_uid=_UID)
    _connected = True
