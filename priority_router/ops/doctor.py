"""Checks for what silently defeats broker priorities in a Celery app.

Each check returns a :class:`Finding`; ``priority-router doctor -A app`` prints them
and exits non-zero when any failed.  An app set up by ``PriorityRouter.install`` passes.

A router in dry run is a finding that is not a failure; what switching it on would set
is listed, and a setting it would set is not counted as a failure either.
"""

from __future__ import annotations

import fnmatch
import functools
import re
import shlex
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import kombu
import redis
from celery import Celery
from kombu.transport.redis import PRIORITY_STEPS as KOMBU_PRIORITY_STEPS
from kombu.transport.redis import Channel as KombuRedisChannel
from redis.sentinel import MasterNotFoundError

from ..config import unknown_celery_settings, unknown_env_settings, with_closest
from ..integration.app_queues import declare_routed, queue_names
from ..integration.brokers import AMQP_MAX_PRIORITY, Transport, transport_of
from ..integration.celery_internals import priority_list
from ..integration.celery_settings import (
    COSTS,
    DISABLED_PREFETCH,
    REDIS_PRIORITY_STEPS,
    Change,
    describe,
    prefetch_disabled,
    wanted_changes,
)
from ..integration.consumers import (
    AHEAD_FIX,
    FIX,
    Consumer,
    blindness,
    consumers,
    eta_held,
    polled_steps,
    taking_ahead,
)
from ..integration.install import STOPGAP, applied_settings, settings_error, settle, unpriced_effect
from ..integration.old_kombu import FIX as KOMBU_FIX
from ..integration.old_kombu import shortfalls
from ..integration.pools import WorkerPool, pool_named, pool_of_stats
from ..integration.publish import mistyped_tasks, own_tasks
from ..integration.rabbitmq import (
    QUORUM_DETECTION_FIX,
    QUORUM_WITHOUT_DETECTION,
    QueueNotPriorityError,
    celery_consumes_quorum,
    channel_of,
    classic_fix,
    is_quorum,
    quorum_note,
    quorum_queues_are,
    rabbitmq_version,
    uses_quorum_queues,
    verify_priority_queues,
)
from ..integration.starvation import AMQP_FIX
from ..integration.stranded import FIX as STRANDED_FIX
from ..limits import Limits
from ..redact import redact_url
from ..router import PriorityRouter, engine_of, installed_router
from ..store.client_ids import glob_escape
from ..store.connection import SENTINEL_FIX, failing_nodes_note, is_cluster, store_error
from ..store.gate import GateState
from ..store.permissions import acl_user, refusal
from ..store.schema import SCHEMA, SchemaMismatch
from ..thresholds import table_name
from .cli_context import store_refusal
from .held_checks import UNCOUNTED_FIX, describe_uncounted, older_release_held, uncounted_held
from .queues import unpriced_waiting
from .rabbitmq_queue import passive
from .saturation import describe as describe_saturation
from .saturation import saturation

#: Seconds after which a document still held with no limit anywhere is stranded: router
#: workers release such documents within a few seconds.
STRANDED_AFTER = 30.0
#: Seconds between the two looks at a client whose held documents have room to start.
STALL_RECHECK = 2.5


DEFAULT_VISIBILITY_TIMEOUT = 3600


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str
    fix: str = ""


Check = Callable[[Celery, Transport], Iterator[Finding]]


def diagnose(app: Celery, pool: WorkerPool | None = None) -> list[Finding]:
    """Run every check that applies to ``app``'s broker, for workers running ``pool``
    (by default the pool the live workers report, else the app's ``worker_pool`` and
    ``worker_concurrency``)."""
    transport = transport_of(app)
    unreadable = settings_error(app)
    if unreadable is not None:
        # The router routes nothing and set nothing: every other check would report that.
        return [
            Finding(
                "router",
                False,
                f"installed, but it cannot read this app's settings, so it routes nothing and sets "
                f"no Celery setting: {unreadable.setting}: {unreadable.problem}",
                f"{unreadable.fix} (in {unreadable.setting}); the other checks run once it is fixed",
            )
        ]
    checks: dict[str, Check] = dict(_CHECKS)
    findings: list[Finding] = []
    # The workers are asked at most once each (broadcasts that wait a second), when a check
    # needs them: which consume the app's queues, with their settings, then their pools.
    answered = functools.cache(lambda: consumers(app, set(queue_names(app))))
    stats = functools.cache(lambda: _worker_stats(app, answered))
    given = pool
    if pool is None:
        pool, said = _pool_to_check(app, stats())
        findings.append(said)
    checks["prefetch"] = functools.partial(_check_prefetch, pool=pool)
    checks["kombu"] = functools.partial(_check_kombu, pool=pool)
    # Caps are checked against the workers answering, else the pool given: never a guess.
    checks["limits"] = functools.partial(_check_limits, pool=given, stats=stats)
    checks["workers"] = functools.partial(_check_consumers, answered=answered)
    checks["eta tasks"] = functools.partial(_check_eta, answered=answered)
    checks["stranded"] = functools.partial(_check_stranded, answered=answered)
    for name, check in checks.items():
        try:
            findings.extend(check(app, transport))
        except Exception as exc:
            findings.append(Finding(name, False, f"could not check: {exc}", _fix_for(exc, app)))
    return findings


def _fix_for(exc: Exception, app: Celery) -> str:
    """What to do about an error that stopped a check."""
    router = installed_router(app)
    refused = refusal(exc)
    if refused is not None and router is not None and "channel" not in str(exc):
        return refused.fix(acl_user(router.config.redis_url), router.config.key_prefix)
    if isinstance(exc, redis.exceptions.NoPermissionError) and "channel" in str(exc):
        return (
            "give the Redis user the channels Celery's remote control publishes on "
            "(ACL SETUSER <user> &*): workers cannot be asked, and Celery's own mingle fails too"
        )
    return "fix what stops the check"


def _check_router(app: Celery, transport: Transport) -> Iterator[Finding]:
    router = installed_router(app)
    if router is None:
        yield Finding(
            "router",
            False,
            "no PriorityRouter is installed on this app, so its messages carry no priority",
            "call PriorityRouter(...).install(app) where the app is created",
        )
    elif router.config.dry_run:
        yield Finding(
            "router",
            True,
            f"installed in dry run: {router!r}. Priorities are computed, counted and shown "
            "(headers, Flower, metrics, CLI) but not applied",
            "to apply them, set dry_run=False (PRIORITY_ROUTER_DRY_RUN=false, or the Celery setting "
            "priority_router_dry_run=False) in the publishers' and the workers' apps",
        )
        yield Finding("dry run", True, "switched on, " + describe(wanted_changes(app, transport)))
    elif transport is Transport.AMQP and router.config.max_wait is not None:
        yield Finding(
            "router",
            False,
            f"installed with max_wait={router.config.max_wait:g} s, which RabbitMQ cannot serve "
            "(docs/max-wait.md): this app's workers refuse to start, while its publishers route",
            AMQP_FIX,
        )
    else:
        yield Finding("router", True, f"installed: {router!r}")


def _check_setting_names(app: Celery, transport: Transport) -> Iterator[Finding]:
    """Router settings the app or the environment spell wrong: ignored, so the default rules."""
    misspelt = {**unknown_celery_settings(app.conf), **unknown_env_settings()}
    if not misspelt:
        return
    yield Finding(
        "setting names",
        False,
        "ignored, not a setting the router reads: " + with_closest(misspelt),
        "rename each to a setting of the configuration reference (docs/configuration.md)",
    )


def _switch_on_sets(app: Celery, transport: Transport, key: str, queue: str | None = None) -> Change | None:
    """What switching a router in dry run on would set for ``key``; None if it is not in
    dry run or would not set it."""
    router = installed_router(app)
    if router is None or not router.config.dry_run:
        return None
    changes = wanted_changes(app, transport)
    return next((c for c in changes if c.key == key and c.queue == queue and not c.kept), None)


def _not_applied(check: str, change: Change) -> Finding:
    return Finding(check, True, f"dry run, so not applied yet: switched on, install() sets {change}")


def _check_kombu(app: Celery, transport: Transport, pool: WorkerPool | None = None) -> Iterator[Finding]:
    """A kombu before 5.7 works, degraded on Redis (``integration/old_kombu.py``): said, not
    failed."""
    lacking = shortfalls(transport, pool)
    if lacking:
        detail = f"kombu {kombu.__version__}, older than 5.7: supported, degraded ({pool}): " + "; ".join(
            lacking
        )
        yield Finding("kombu", True, detail, f"for the full behaviour: {KOMBU_FIX}")
    else:
        yield Finding("kombu", True, f"kombu {kombu.__version__}")


#: The settings a worker pool needs, by the doctor check that reports each.
_POOL_CHECKS = {
    "worker_prefetch_multiplier": "prefetch",
    "worker_disable_prefetch": "prefetch",
    "max_connections": "prefetch",
    "broker_heartbeat": "heartbeat",
}


def _check_prefetch(app: Celery, transport: Transport, pool: WorkerPool | None = None) -> Iterator[Finding]:
    """The values the worker's pool needs: the prefetch multiplier, on a green pool with
    the Redis broker kombu's connection limit, and with RabbitMQ no AMQP heartbeats
    (``integration/pools.py``, ``integration/celery_settings.py``)."""
    pool = pool or pool_named(app.conf.worker_pool, app.conf.worker_concurrency)
    router = installed_router(app)
    changes = [
        c for c in wanted_changes(app, transport, pool, applied_settings(app)) if c.key in _POOL_CHECKS
    ]
    checks = {_POOL_CHECKS[c.key] for c in changes}
    if "prefetch" not in checks:
        options = app.conf.broker_transport_options or {}
        shown = f"worker_prefetch_multiplier={app.conf.worker_prefetch_multiplier}"
        if prefetch_disabled(app.conf, transport):
            shown += f", worker_disable_prefetch=True ({DISABLED_PREFETCH})"
        if pool.green and transport is Transport.REDIS:
            shown += f", max_connections={options.get('max_connections')}"
        if pool.green and transport is Transport.AMQP and "heartbeat" not in checks:
            shown += f", broker_heartbeat={app.conf.broker_heartbeat}"
        yield Finding("prefetch", True, f"{pool}: {shown}")
    for change in changes:
        check = _POOL_CHECKS[change.key]
        if router is not None and not change.kept:
            if router.config.dry_run:
                yield _not_applied(check, change)
            else:
                yield Finding(check, True, f"{pool}: install() sets {change} when the worker starts")
            continue
        fix = f"set {change.shown(change.wanted)}" + (
            "" if router is None else " (install() does unless you set it yourself)"
        )
        if change.key == "worker_disable_prefetch":
            fix = (
                "set worker_disable_prefetch = False for these workers and drop --disable-prefetch from "
                "their command line, or run them on the threads or prefork pool"
            )
        if change.key == "broker_heartbeat":
            fix = (
                "set broker_heartbeat = 0 for these workers (CELERY_BROKER_HEARTBEAT = 0 in Django "
                "settings; with the router installed, leaving it unset does too), or run them on the "
                "threads or prefork pool"
            )
        yield Finding(check, False, f"{pool}: {change.shown(change.current)}: {change.cost}", fix)


def _check_acks(app: Celery, transport: Transport) -> Iterator[Finding]:
    change = _switch_on_sets(app, transport, "task_acks_late")
    if change is not None:
        yield _not_applied("acks_late", change)
        return
    if not app.conf.task_acks_late:
        yield Finding(
            "acks_late",
            False,
            f"task_acks_late=False: {COSTS['task_acks_late']}",
            "set task_acks_late = True (install() does unless you set it)",
        )
        return
    early = sorted(
        name for name, task in app.tasks.items() if not name.startswith("celery.") and not task.acks_late
    )
    if early:
        yield Finding(
            "acks_late",
            False,
            f"tasks with acks_late=False: {', '.join(early)}",
            "drop acks_late=False from those task decorators; if they set none, the tasks were "
            "bound before install() set task_acks_late: call install(app) before the tasks are "
            "first used (docs/limitations.md)",
        )
    else:
        yield Finding("acks_late", True, "task_acks_late=True")


def _check_redis_steps(app: Celery, transport: Transport) -> Iterator[Finding]:
    if transport is not Transport.REDIS:
        return
    options = app.conf.broker_transport_options or {}
    steps = list(options.get("priority_steps", KOMBU_PRIORITY_STEPS))
    change = _switch_on_sets(app, transport, "priority_steps")
    if change is not None:
        yield _not_applied("priority_steps", change)
    elif steps != REDIS_PRIORITY_STEPS:
        yield Finding(
            "priority_steps",
            False,
            f"broker_transport_options['priority_steps']={steps}: {COSTS['priority_steps']}",
            "set priority_steps to list(range(10)) (install() does unless you set it)",
        )
    else:
        yield Finding("priority_steps", True, "priority_steps 0..9")
    order = options.get("queue_order_strategy", KombuRedisChannel.queue_order_strategy)
    change = _switch_on_sets(app, transport, "queue_order_strategy")
    if change is not None:
        yield _not_applied("queue_order_strategy", change)
    elif order != "priority":
        yield Finding(
            "queue_order_strategy",
            False,
            f"queue_order_strategy={order!r}: {COSTS['queue_order_strategy']}",
            "set broker_transport_options['queue_order_strategy'] = 'priority'",
        )


def _check_visibility(app: Celery, transport: Transport) -> Iterator[Finding]:
    if transport is not Transport.REDIS:
        return
    options = app.conf.broker_transport_options or {}
    timeout = float(options.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT))
    tasks = {name: task.time_limit for name, task in app.tasks.items() if not name.startswith("celery.")}
    limits = {"task_time_limit": app.conf.task_time_limit, **tasks}
    known = {name: float(v) for name, v in limits.items() if v}
    if not known:
        yield Finding(
            "visibility_timeout",
            True,
            f"visibility_timeout={timeout:g}s; no task time limit is set, so a document running "
            "longer than that is redelivered while it runs",
        )
        return
    name, longest = max(known.items(), key=lambda kv: kv[1])
    if longest > timeout:
        yield Finding(
            "visibility_timeout",
            False,
            f"visibility_timeout={timeout:g}s is shorter than {name}={longest:g}s: a document still "
            "running is redelivered to another worker and runs twice",
            f"set broker_transport_options['visibility_timeout'] above {longest:g}",
        )
    else:
        yield Finding("visibility_timeout", True, f"visibility_timeout={timeout:g}s >= {name}={longest:g}s")


def _check_stranded(
    app: Celery, transport: Transport, answered: Callable[[], list[Consumer] | None] | None = None
) -> Iterator[Finding]:
    """Non-empty priority lists that no worker polls: those of this configuration's
    ``priority_steps`` (a producer with other ``priority_steps`` or ``sep`` than the workers
    strands messages there), and with the router, those of the steps no worker consuming
    the queue polls, as the workers answer (``answered()``)."""
    if transport is not Transport.REDIS:
        return
    names = set(queue_names(app))
    router = installed_router(app)
    skipped = _skipped_steps(names, answered) if router is not None and not router.config.dry_run else {}
    stranded: list[str] = []
    queues: set[str] = set()
    unpolled: list[str] = []
    with app.connection_for_read() as conn:
        channel = conn.default_channel
        prefix = channel.global_keyprefix or ""
        polled = {prefix + priority_list(channel, n, s) for n in names for s in channel.priority_steps}
        # A plain client on kombu's pool: kombu's own one prefixes keys a second time.
        client = redis.Redis(connection_pool=channel.client.connection_pool)
        for name in sorted(names):
            pattern = glob_escape(prefix + name) + "*"
            for key in client.scan_iter(match=pattern, count=500, _type="list"):
                text = key.decode(errors="replace") if isinstance(key, bytes) else key
                rest = text[len(prefix + name) :]
                if text in polled or not re.fullmatch(r"[^A-Za-z0-9]+\d+", rest or "x"):
                    continue
                length = int(client.llen(key))
                if length:
                    stranded.append(f"{text!r} ({length} messages)")
                    queues.add(name)
        for name, (steps, workers) in sorted(skipped.items()):
            keys = dict.fromkeys(prefix + priority_list(channel, name, s) for s in channel.priority_steps)
            seen = {prefix + priority_list(channel, name, s) for s in steps}
            waiting = [(key, int(client.llen(key))) for key in keys if key not in seen]
            shown = ", ".join(f"{key!r} ({length} messages)" for key, length in waiting if length)
            if shown:
                unpolled.append(
                    f"{shown}: the workers consuming {name!r} ({workers}) poll the lists of priority "
                    f"steps {sorted(steps)} only"
                )
    if unpolled:
        yield Finding(
            "stranded",
            False,
            "documents wait in priority lists no worker takes from: " + "; ".join(unpolled),
            STRANDED_FIX,
        )
    if stranded and router is None:
        commands = "; ".join(
            f"priority-router migrate {shlex.quote(q)} --to plain -A <this app>" for q in sorted(queues)
        )
        yield Finding(
            "stranded",
            False,
            "documents wait in priority lists this app's workers do not poll (a router queued them; "
            "this app runs without it): " + ", ".join(stranded),
            f"switching the router off: move them into lists its workers poll, while they run "
            f"({commands}); switching it on: install it in this app's workers too",
        )
    elif stranded:
        yield Finding(
            "stranded",
            False,
            "priority lists no worker polls: " + ", ".join(stranded),
            "give producers and workers the same broker_transport_options (priority_steps, sep); "
            "install() on both sides does",
        )
    elif not unpolled:
        yield Finding("stranded", True, "no messages in priority lists the workers do not poll")


def _skipped_steps(
    names: set[str], answered: Callable[[], list[Consumer] | None] | None
) -> dict[str, tuple[set[int], str]]:
    """The priority steps the workers answering poll, for each queue of ``names`` whose every
    answering consumer gave its settings, with those workers' names."""
    found = answered() if answered is not None else None
    steps: dict[str, set[int]] = {}
    workers: dict[str, list[str]] = {}
    unknown: set[str] = set()
    for consumer in found or ():
        if consumer.queue not in names:
            continue
        polled = polled_steps(consumer)
        if polled is None:
            unknown.add(consumer.queue)
            continue
        steps.setdefault(consumer.queue, set()).update(polled)
        workers.setdefault(consumer.queue, []).append(consumer.worker)
    return {q: (s, ", ".join(sorted(workers[q]))) for q, s in steps.items() if q not in unknown}


def _check_unrouted(app: Celery, transport: Transport) -> Iterator[Finding]:
    """Documents waiting without any priority: their publisher has no router."""
    if transport is not Transport.REDIS:
        return
    waiting = unpriced_waiting(app, queue_names(app))
    if not waiting:
        yield Finding("unrouted", True, "no waiting document lacks a priority")
        return
    shown = ", ".join(f"{n} in {q!r}" for q, n in sorted(waiting.items()))
    yield Finding(
        "unrouted",
        False,
        f"documents published without the router wait now ({shown}): " + unpriced_effect(transport),
        "install the router in every publishing app (PriorityRouter(...).install(app)); until then, "
        + STOPGAP,
    )


def _check_amqp_queues(app: Celery, transport: Transport) -> Iterator[Finding]:
    if transport is not Transport.AMQP:
        return
    declare_routed(app)
    settle(app)  # the arguments the router gives the queues just created, as on a publish
    queues = list(app.amqp.queues.values())
    quorum = [q.name for q in queues if is_quorum(q)]
    if quorum:
        honoured, note = quorum_note(rabbitmq_version(app))
        yield Finding(
            "quorum",
            honoured,
            f"{quorum_queues_are(quorum)}. {note}",
            "" if honoured else f"upgrade to RabbitMQ 4.0 or later, or {classic_fix(app)}",
        )
        if not celery_consumes_quorum(app.conf):
            yield Finding(
                "quorum",
                False,
                f"queues {', '.join(quorum)}: {QUORUM_WITHOUT_DETECTION}",
                QUORUM_DETECTION_FIX,
            )
    bare = [
        q
        for q in queues
        if not is_quorum(q)
        and (q.queue_arguments or {}).get("x-max-priority", app.amqp.queues.max_priority) in (None, 0)
    ]
    for queue in bare:
        if _exists_as_priority_queue(app, queue):
            yield Finding(
                "x-max-priority",
                False,
                f"queue {queue.name!r} exists on RabbitMQ as a priority queue (priority-router's "
                "publishers declared it), but this app declares it without x-max-priority, so its "
                "workers fail to start with PRECONDITION_FAILED (inequivalent arg 'x-max-priority')",
                "install the router in this app too (PriorityRouter(...).install(app)): it declares "
                f"the queue with x-max-priority={AMQP_MAX_PRIORITY}",
            )
        elif (change := _switch_on_sets(app, transport, "x-max-priority", queue.name)) is not None:
            yield _not_applied("x-max-priority", change)
        else:
            yield Finding(
                "x-max-priority",
                False,
                f"queue {queue.name!r} is declared without x-max-priority, so RabbitMQ ignores "
                "message priorities on it",
                # The setting would add x-max-priority to the quorum queues too, which RabbitMQ refuses.
                f"declare it in task_queues with queue_arguments={{'x-max-priority': {AMQP_MAX_PRIORITY}}}"
                if uses_quorum_queues(app)
                else f"set task_queue_max_priority = {AMQP_MAX_PRIORITY} (install() does)",
            )
    if bare:
        return
    try:
        # Passive first: the doctor creates nothing a worker has not created yet.
        checked = verify_priority_queues(app, create=False)
    except QueueNotPriorityError as exc:
        yield Finding("queue type" if exc.other_type else "x-max-priority", False, exc.problem, exc.fix)
        return
    missing = [q.name for q in queues if q.name not in checked and not is_quorum(q)]
    checked = [name for name in checked if name not in quorum]
    detail = "priority queues: " + (", ".join(checked) or "none declared yet")
    if missing:
        detail += f"; not created yet (a worker will declare them with priorities): {', '.join(missing)}"
    yield Finding("x-max-priority", True, detail)


def _exists_as_priority_queue(app: Celery, queue: Any) -> bool:
    """Whether ``queue`` exists on the server with ``x-max-priority`` while ``app`` declares
    it without: RabbitMQ then refuses the app's declaration."""
    from amqp.exceptions import PreconditionFailed

    with app.connection_for_write() as conn:
        if passive(conn, queue.name) is None:
            return False
        with channel_of(conn) as channel:
            try:
                queue.bind(channel).declare()  # it exists, so this creates nothing
            except PreconditionFailed as exc:
                return "x-max-priority" in str(exc)
    return False


def _check_counter(app: Celery, transport: Transport) -> Iterator[Finding]:
    router = installed_router(app)
    if router is None:
        return
    where = redact_url(router.config.redis_url)
    timeout = router.config.socket_timeout
    cluster = is_cluster(engine_of(router).redis)
    state = "ok"
    try:
        if cluster:
            # A plain PING reaches one node of a cluster; every client is counted only when
            # every master answers and the cluster says it serves all slots.
            engine_of(router).redis.ping(target_nodes="primaries")
            info = engine_of(router).redis.execute_command("CLUSTER INFO")  # type: ignore[no-untyped-call]
            state = info.get("cluster_state", "?")
        started = time.perf_counter()
        engine_of(router).redis.ping()
        took = time.perf_counter() - started
        version = _version(engine_of(router).redis)
    except Exception as exc:
        yield _store_failure(router, where, exc)
        return
    kind = "Redis Cluster" if cluster else "Redis"
    if took > timeout:
        # Slow, but it answers: what it holds is still read below.
        yield Finding(
            "counter store",
            False,
            f"the counter store at {where} (Redis {version}) took {took * 1000:.0f} ms to answer a "
            f"PING, more than socket_timeout={timeout * 1000:.0f} ms, so publishes fail open",
            "use a Redis closer to the publishers, or raise socket_timeout",
        )
    elif cluster and state != "ok":
        yield Finding(
            "counter store",
            False,
            f"the Redis Cluster at {where} says cluster_state:{state}, so documents are published "
            f"at default_priority={router.config.default_priority} until it is ok again",
            "bring the failed masters back or let their replicas take over (redis-cli --cluster check)",
        )
        return
    else:
        yield Finding("counter store", True, f"{kind} {version} at {where} answers in {took * 1000:.1f} ms")
    try:
        engine_of(router).schema.check(claim=False)
    except SchemaMismatch as exc:
        yield Finding("schema", False, exc.problem, exc.fix)
    else:
        yield Finding("schema", True, f"the store at {where} is laid out by schema {SCHEMA}, this release's")
    yield _check_table(router)


def _version(client: redis.Redis) -> str:
    """The server's version, from ``INFO server``; "?" when the user may not ask (the
    CLI's ACL line gives it ``INFO``, a publisher's does not: the router never needs it)."""
    try:
        return str(client.info("server").get("redis_version", "?"))
    except redis.exceptions.NoPermissionError:
        return "? (this Redis user may not run INFO, which only doctor asks)"


#: What publishers do meanwhile, while the store fails (``local_counts.py``).
LOCAL_NOTE = "their own process's recent counts of each client (reason 'local'), not the store's"


def _store_failure(router: PriorityRouter, where: str, exc: Exception) -> Finding:
    """Why the counter store failed doctor's questions, each case with its own fix: it
    refuses a command (ACL), the password, or the TLS handshake, or it does not answer."""
    config = router.config
    default = f"default_priority={config.default_priority}"
    refused = store_refusal(exc, config.redis_url, config.key_prefix)
    if refused is not None:
        problem, fix = refused
        meanwhile = (
            f": what needs it fails open (a publish goes out at {default}), and doctor cannot check "
            "the store further"
            if refusal(exc) is not None
            else f", so publishers price documents by {LOCAL_NOTE}"
        )
        return Finding("counter store", False, f"the counter store at {where} {problem}{meanwhile}", fix)
    said = store_error(exc)
    return Finding(
        "counter store",
        False,
        f"the counter store at {where} does not answer ({said}), so publishers price documents by "
        f"{LOCAL_NOTE}" + failing_nodes_note(engine_of(router).redis),
        SENTINEL_FIX
        if isinstance(exc, MasterNotFoundError)
        else "start Redis there, or point redis_url / PRIORITY_ROUTER_REDIS_URL at one that answers",
    )


def _check_table(router: PriorityRouter) -> Finding:
    """Whether two or more clients share the threshold table's last row (served FIFO among them)."""
    policy = router.policy
    found = saturation(
        policy, ((s.client_id, s.pending) for s in engine_of(router).store.scan() if s.ttl_ms is not None)
    )
    if found is not None:
        # Said, not failed: it is how the table serves a busy hour, not a broken deployment.
        problem, fix = describe_saturation(found, policy, router.config.mode)
        return Finding("threshold table", True, f"{table_name(policy)}: {problem}. Fix: {fix}")
    last = policy.thresholds[0]
    return Finding(
        "threshold table",
        True,
        f"{table_name(policy)}: no two clients share its last row (pending < {last.below}, "
        f"priority {last.priority})",
    )


def _check_consumers(
    app: Celery, transport: Transport, answered: Callable[[], list[Consumer] | None] | None = None
) -> Iterator[Finding]:
    """The workers consuming the app's queues (``answered()``: what they answered)."""
    if transport not in (Transport.REDIS, Transport.AMQP):
        return
    router = installed_router(app)
    if router is not None and router.config.dry_run:
        yield Finding("workers", True, "not checked: in dry run the messages carry plain Celery's priorities")
        return
    found = answered() if answered is not None else consumers(app, set(queue_names(app)))
    if found is None:
        yield Finding("workers", True, "no worker answered, so none could be checked")
        return
    if not found:
        yield Finding("workers", True, "no worker answering consumes these queues")
        return
    blind = blindness(found, transport)
    for worker in blind:
        yield Finding("workers", False, worker.detail, FIX)
    # What the prefetch and acks_late lines above judge is this app as loaded here, with
    # this shell's environment; the workers' own settings may differ (environment variables
    # are per process).
    ahead = taking_ahead(found, transport)
    for detail in ahead:
        yield Finding("workers", False, detail, AHEAD_FIX)
    unread = sorted({c.worker for c in found if c.conf is None})
    if unread:
        yield Finding(
            "workers",
            True,
            f"not checked: {', '.join(unread)} did not give its settings within 1 s (a busy worker); "
            "run doctor again to check it",
        )
    if not blind and not ahead and len(unread) < len({c.worker for c in found}):
        yield Finding(
            "workers",
            True,
            f"every worker {'else ' if unread else ''}consuming these queues takes every priority, one "
            "document a slot, acknowledged late",
        )


#: What to do about eta and countdown tasks on the document workers.
ETA_FIX = (
    "send eta and countdown tasks to a queue of their own with workers of their own (task_routes, "
    "or apply_async(queue=...)), so the document workers hold none; or leave worker_eta_task_limit "
    "unset, or set it above the eta tasks a worker holds at once plus its pool's size (docs/brokers.md)"
)


def _check_eta(
    app: Celery, transport: Transport, answered: Callable[[], list[Consumer] | None] | None = None
) -> Iterator[Finding]:
    """Eta and countdown tasks the workers of the app's queues hold until they come due:
    each holds a place in its worker's prefetch window, which Celery widens by one for
    each, up to ``worker_eta_task_limit`` (Celery 5.6): a worker holding that many takes no
    document until one comes due."""
    if transport not in (Transport.REDIS, Transport.AMQP):
        return
    found = answered() if answered is not None else consumers(app, set(queue_names(app)))
    confs = {c.worker: c.conf for c in found or ()}
    held = eta_held(app, set(confs))
    here = app.conf.get("worker_eta_task_limit")
    stalled = False
    for worker, count in sorted(held.items()):
        conf = confs[worker]
        limit = here if conf is None else conf.get("worker_eta_task_limit")
        if count and isinstance(limit, int) and count >= limit:
            stalled = True
            yield Finding(
                "eta tasks",
                False,
                f"worker {worker} holds {count} eta/countdown task(s), as many as its "
                f"worker_eta_task_limit={limit}: they fill the prefetch window that setting caps, so it "
                "takes no document until one comes due",
                ETA_FIX,
            )
    if stalled:
        return
    if held:
        now = f"{sum(held.values())} held now by the {len(held)} worker(s) answering"
    else:
        now = "no worker of these queues answered"
    if isinstance(here, int):
        yield Finding(
            "eta tasks",
            True,
            f"worker_eta_task_limit={here}: a worker's eta and countdown tasks hold places in the "
            f"prefetch window this caps, so a worker holding {here} of them takes no document until "
            f"one comes due ({now})",
            ETA_FIX,
        )
    else:
        yield Finding(
            "eta tasks",
            True,
            f"eta and countdown tasks: {now}. A worker holds each one it takes, unacknowledged, until "
            "it comes due, and widens its prefetch window by one for it, so its documents keep their "
            "slots; once due, it runs ahead of the documents waiting in the queue, whatever their priority",
            ETA_FIX if any(held.values()) else "",
        )


def _check_tasks(app: Celery, transport: Transport) -> Iterator[Finding]:
    router = installed_router(app)
    patterns = None if router is None else router.config.tasks
    if patterns is None:
        return
    registered = own_tasks(app)
    mistyped = mistyped_tasks(patterns, registered)
    if mistyped:
        missed = (f"{name} ({pattern!r} matches no task of this app)" for pattern, name in mistyped.items())
        yield Finding(
            "tasks",
            False,
            "the tasks setting counts no document of " + ", ".join(missed),
            "correct those patterns (task names or globs, docs/configuration.md): an uncounted "
            "document keeps the priority plain Celery gives it",
        )
    else:
        counted = [name for name in registered if any(fnmatch.fnmatchcase(name, p) for p in patterns)]
        shown = ", ".join(counted) or "tasks sent by name"
        yield Finding("tasks", True, f"counts {shown} ({', '.join(patterns)})")


def _check_default_priority(app: Celery, transport: Transport) -> Iterator[Finding]:
    default = app.conf.task_default_priority
    if default is None:
        return
    yield Finding(
        "task_default_priority",
        True,
        f"task_default_priority={default}: documents without a client id go out at {default}; "
        "counted documents get the router's priority instead; a per-call priority= equal to "
        f"{default} cannot be told from the default and is treated as it",
    )


def _check_limits(
    app: Celery,
    transport: Transport,
    pool: WorkerPool | None = None,
    stats: Callable[[], Mapping[str, Any]] | None = None,
) -> Iterator[Finding]:
    router = installed_router(app)
    if router is None:
        return
    clients = {c: v for c, v in engine_of(router).limit_store.all().items() if isinstance(v, Limits) and v}
    default = engine_of(router).limit_store.get_default()
    now = time.time() * 1000
    held = engine_of(router).gate_store.held_now()
    if not clients and not default:
        oldest = min((s.oldest_held_ms for s in held.values() if s.oldest_held_ms is not None), default=None)
        if oldest is not None and now - oldest > STRANDED_AFTER * 1000:
            yield Finding(
                "limits",
                False,
                f"{sum(s.held for s in held.values())} document(s) are still held although no client has "
                f"limits, the oldest for {(now - oldest) / 1000:.0f} s: workers with the router release "
                "them within seconds, so none runs (a rollback, or the router switched off)",
                "start one worker with this release's router until `priority-router status` shows none held",
            )
        return
    answering = stats() if stats is not None else _worker_stats(app)
    slots, whose = _pool_slots(answering, pool)
    if held and not answering:
        yield Finding(
            "held",
            False,
            f"{sum(s.held for s in held.values())} document(s) are held by caps and no worker "
            "answered (inspect stats, 1 s): only workers with the router release them",
            "start the workers, with the router installed; `priority-router status` shows what is held",
        )
    capped = False
    for client, limits in sorted(clients.items()) + (
        [("every client without a tier", default)] if default else []
    ):
        cap = limits.max_in_flight
        capped = capped or cap is not None
        if cap is not None and slots is not None and cap >= slots:
            name = client if client.startswith("every client") else repr(client)
            yield Finding(
                "limits",
                False,
                f"the cap of {name}, max_in_flight={cap}, is at least the whole pool "
                f"({slots} slot(s), {whose}): it can never hold a document",
                f"set it below {slots} (`priority-router tier set ... --max-in-flight N`), or drop it",
            )
    max_wait = router.config.max_wait
    for client, state in held.items():
        if max_wait is None or state.oldest_held_ms is None:
            continue
        waited = (now - state.oldest_held_ms) / 1000
        if waited > max_wait:
            # Not a failure: holding is what the limits ask for, and a capped client's burst
            # outlasts max_wait in normal running (doctor as a health check failed every one).
            yield Finding(
                "limits",
                True,
                f"client {client!r} has {state.held} document(s) held by its limits, the oldest for "
                f"{waited:.0f} s, longer than max_wait={max_wait:g} s: max_wait promotes documents "
                "waiting in the queue, not ones a cap or rate holds",
                "if they must start sooner, raise its max_in_flight or rate",
            )
    yield from _stalled(router, held)
    shown = f"{len(clients)} client(s) with limits" + (f", default {default.describe()}" if default else "")
    if held:
        shown += f", {sum(s.held for s in held.values())} document(s) held now"
    if capped and slots is None:
        shown += (
            "; the caps could not be checked against the pool: no worker answered and no -P/-c "
            "was given (pass them as the workers are started, or run doctor while they run)"
        )
    elif slots is not None:
        shown += f"; pool {slots} slot(s) ({whose})"
    yield Finding("limits", True, shown)


def _stalled(router: PriorityRouter, held: Mapping[str, GateState]) -> Iterator[Finding]:
    """Clients with documents held while their caps have room and no rate holds them: a
    router worker releases such documents within 2 s, so if they are still held a moment
    later, none is doing so (none runs, or none reaches the store or the broker)."""
    free = [c for c, state in held.items() if _room(state, router.limits(c))]
    if not free:
        return
    time.sleep(STALL_RECHECK)
    for client in free:
        state = router.gate_state(client)
        limits = router.limits(client)
        if not _room(state, limits):
            continue
        yield Finding(
            "limits",
            False,
            f"client {client!r} has {state.held} document(s) held while {state.running} of its "
            f"{limits.describe()} run: router workers release such documents within 2 s, and none did",
            "start a worker with the router, and check that the workers reach the counter store and the "
            "broker (their logs say when either fails)",
        )


def _check_held_releases(app: Celery, transport: Transport) -> Iterator[Finding]:
    """Held documents where this release's workers do not see them (docs/lifecycle.md): in an
    older release's layout in the counter store, or in holding queues the store does not count."""
    router = installed_router(app)
    if router is None:
        return
    old = older_release_held(router)
    if old is not None:
        yield Finding("held documents", False, *old)
    gaps = uncounted_held(app, router)
    if gaps:
        yield Finding("held documents", False, describe_uncounted(gaps), UNCOUNTED_FIX)


def _room(state: GateState, limits: Limits) -> bool:
    cap = limits.max_in_flight
    return bool(state.held) and limits.rate is None and cap is not None and state.running < cap


def _worker_stats(
    app: Celery, answered: Callable[[], list[Consumer] | None] | None = None
) -> Mapping[str, Any]:
    """What the live workers consuming the app's queues (``answered()``, else asked here)
    answer to ``inspect stats``, by worker; empty when none answers.  Other apps' workers
    on the same broker answer too, and their pools are not this app's."""
    try:
        found = answered() if answered is not None else consumers(app, set(queue_names(app)))
        if not found:
            return {}
        with app.connection_for_write() as conn:
            stats: dict[str, Any] = app.control.inspect(timeout=1.0, connection=conn).stats() or {}
    except Exception:
        return {}
    ours = {c.worker for c in found}
    return {worker: stat for worker, stat in stats.items() if worker in ours}


def _pool_to_check(app: Celery, stats: Mapping[str, Any]) -> tuple[WorkerPool, Finding]:
    """The pool the answering workers run when they all run one, else the app's settings'."""
    configured = pool_named(app.conf.worker_pool, app.conf.worker_concurrency)
    live = {pool for pool in map(pool_of_stats, stats.values()) if pool is not None}
    if len(live) == 1:
        (pool,) = live
        return pool, Finding("pool", True, f"{pool}, as the {len(stats)} worker(s) answering run")
    if live:
        shown = "; ".join(sorted(map(str, live)))
        return configured, Finding(
            "pool",
            True,
            f"the workers answering run different pools ({shown}); checked for the app's settings: "
            f"{configured}. Pass -P and -c to check another",
        )
    return configured, Finding(
        "pool",
        True,
        f"{configured}, from the app's worker_pool and worker_concurrency (no worker answered); "
        "pass -P and -c as the workers are started",
    )


def _pool_slots(stats: Mapping[str, Any], pool: WorkerPool | None) -> tuple[int | None, str]:
    """The slots of every worker that answers (an autoscaled one: its most), else of the
    pool named (one worker)."""
    # An autoscaled worker may grow to its autoscaler's maximum.
    answered = [
        (s.get("autoscaler") or {}).get("max") or s.get("pool", {}).get("max-concurrency")
        for s in stats.values()
    ]
    counted = [n for n in answered if isinstance(n, int)]
    if counted:
        return sum(counted), f"{len(counted)} worker(s) answering"
    if pool is not None:
        return pool.concurrency, f"one worker, {pool}"
    return None, "no worker answered"


_CHECKS: dict[str, Check] = {
    "router": _check_router,
    "setting names": _check_setting_names,
    "tasks": _check_tasks,
    "kombu": _check_kombu,
    "prefetch": _check_prefetch,
    "acks_late": _check_acks,
    "priority_steps": _check_redis_steps,
    "visibility_timeout": _check_visibility,
    "stranded": _check_stranded,
    "unrouted": _check_unrouted,
    "x-max-priority": _check_amqp_queues,
    "counter store": _check_counter,
    "workers": _check_consumers,
    "eta tasks": _check_eta,
    "task_default_priority": _check_default_priority,
    "limits": _check_limits,
    "held documents": _check_held_releases,
}
