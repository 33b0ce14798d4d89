"""Checks for what silently defeats broker priorities in a Celery app.

Each check returns a :class:`Finding`; ``priority-router doctor -A app`` prints them
and exits non-zero when any failed.  An app set up by ``PriorityRouter.install`` passes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import kombu
import redis
from celery import Celery
from kombu.transport.redis import PRIORITY_STEPS as KOMBU_PRIORITY_STEPS
from kombu.transport.redis import Channel as KombuRedisChannel

from .amqp_queues import QueueNotPriorityError, verify_priority_queues
from .app_settings import COSTS, REDIS_PRIORITY_STEPS
from .counter import _glob_escape
from .router import installed_router, transport_of
from .wire import AMQP_MAX_PRIORITY, Transport

#: kombu before 5.4 drops a message's priority when it restores an unacked message.
MIN_KOMBU = (5, 4)
DEFAULT_VISIBILITY_TIMEOUT = 3600


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str
    fix: str = ""


Check = Callable[[Celery, Transport], Iterator[Finding]]


def diagnose(app: Celery) -> list[Finding]:
    """Run every check that applies to ``app``'s broker."""
    transport = transport_of(app)
    findings: list[Finding] = []
    for name, check in _CHECKS.items():
        try:
            findings.extend(check(app, transport))
        except Exception as exc:
            findings.append(Finding(name, False, f"could not check: {exc}", "fix what stops the check"))
    return findings


def _check_router(app: Celery, transport: Transport) -> Iterator[Finding]:
    router = installed_router(app)
    if router is None:
        yield Finding(
            "router",
            False,
            "no PriorityRouter is installed on this app, so its messages carry no priority",
            "call PriorityRouter(...).install(app) where the app is created",
        )
    else:
        yield Finding("router", True, f"installed: {router!r}")


def _check_kombu(app: Celery, transport: Transport) -> Iterator[Finding]:
    version = tuple(int(p) for p in re.findall(r"\d+", kombu.__version__)[:2])
    if version < MIN_KOMBU:
        yield Finding(
            "kombu",
            False,
            f"kombu {kombu.__version__} loses a message's priority when it redelivers it",
            "upgrade: pip install 'kombu>=5.4'",
        )
    else:
        yield Finding("kombu", True, f"kombu {kombu.__version__}")


def _check_prefetch(app: Celery, transport: Transport) -> Iterator[Finding]:
    value = app.conf.worker_prefetch_multiplier
    if value != 1:
        yield Finding(
            "prefetch",
            False,
            f"worker_prefetch_multiplier={value}: {COSTS['worker_prefetch_multiplier']}",
            "set worker_prefetch_multiplier = 1 (install() does unless you set it)",
        )
    else:
        yield Finding("prefetch", True, "worker_prefetch_multiplier=1")


def _check_acks(app: Celery, transport: Transport) -> Iterator[Finding]:
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
            "drop acks_late=False from those task decorators",
        )
    else:
        yield Finding("acks_late", True, "task_acks_late=True")


def _check_redis_steps(app: Celery, transport: Transport) -> Iterator[Finding]:
    if transport is not Transport.REDIS:
        return
    options = app.conf.broker_transport_options or {}
    steps = list(options.get("priority_steps", KOMBU_PRIORITY_STEPS))
    if steps != REDIS_PRIORITY_STEPS:
        yield Finding(
            "priority_steps",
            False,
            f"broker_transport_options['priority_steps']={steps}: {COSTS['priority_steps']}",
            "set priority_steps to list(range(10)) (install() does unless you set it)",
        )
    else:
        yield Finding("priority_steps", True, "priority_steps 0..9")
    order = options.get("queue_order_strategy", KombuRedisChannel.queue_order_strategy)
    if order != "priority":
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
    limits = {"task_time_limit": app.conf.task_time_limit}
    limits.update(
        {name: task.time_limit for name, task in app.tasks.items() if not name.startswith("celery.")}
    )
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


def _check_stranded(app: Celery, transport: Transport) -> Iterator[Finding]:
    """Non-empty priority lists that no worker of this configuration polls: a producer
    with other ``priority_steps`` or ``sep`` than the workers strands messages there."""
    if transport is not Transport.REDIS:
        return
    names = {q.name for q in app.amqp.queues.values()} or {app.conf.task_default_queue}
    stranded: list[str] = []
    with app.connection_for_read() as conn:
        channel = conn.default_channel
        prefix = channel.global_keyprefix or ""
        polled = {prefix + channel._q_for_pri(n, s) for n in names for s in channel.priority_steps}
        # A plain client on kombu's pool: kombu's own one prefixes keys a second time.
        client = redis.Redis(connection_pool=channel.client.connection_pool)
        for name in sorted(names):
            pattern = _glob_escape(prefix + name) + "*"
            for key in client.scan_iter(match=pattern, count=500, _type="list"):
                text = key.decode(errors="replace") if isinstance(key, bytes) else key
                rest = text[len(prefix + name) :]
                if text in polled or not re.fullmatch(r"[^A-Za-z0-9]+\d+", rest or "x"):
                    continue
                length = int(client.llen(key))
                if length:
                    stranded.append(f"{text!r} ({length} messages)")
    if stranded:
        yield Finding(
            "stranded",
            False,
            "priority lists no worker polls: " + ", ".join(stranded),
            "give producers and workers the same broker_transport_options (priority_steps, sep); "
            "install() on both sides does",
        )
    else:
        yield Finding("stranded", True, "no messages in priority lists the workers do not poll")


def _check_amqp_queues(app: Celery, transport: Transport) -> Iterator[Finding]:
    if transport is not Transport.AMQP:
        return
    bad = False
    for queue in app.amqp.queues.values():
        args = queue.queue_arguments or {}
        if args.get("x-max-priority", app.amqp.queues.max_priority) in (None, 0):
            bad = True
            yield Finding(
                "x-max-priority",
                False,
                f"queue {queue.name!r} is declared without x-max-priority, so RabbitMQ ignores "
                "message priorities on it",
                f"set task_queue_max_priority = {AMQP_MAX_PRIORITY} (install() does)",
            )
        if args.get("x-queue-type") == "quorum":
            bad = True
            yield Finding(
                "quorum",
                False,
                f"queue {queue.name!r} is a quorum queue: only two priority levels, served about 2:1",
                "use a classic queue for strict priority ordering",
            )
    if bad:
        return
    try:
        # Passive first: the doctor creates nothing a worker has not created yet.
        checked = verify_priority_queues(app, create=False)
    except QueueNotPriorityError as exc:
        yield Finding("x-max-priority", False, exc.problem, exc.fix)
        return
    missing = [q.name for q in app.amqp.queues.values() if q.name not in checked]
    detail = "priority queues: " + (", ".join(checked) or "none declared yet")
    if missing:
        detail += f"; not created yet (a worker will declare them with priorities): {', '.join(missing)}"
    yield Finding("x-max-priority", True, detail)


_CHECKS: dict[str, Check] = {
    "router": _check_router,
    "kombu": _check_kombu,
    "prefetch": _check_prefetch,
    "acks_late": _check_acks,
    "priority_steps": _check_redis_steps,
    "visibility_timeout": _check_visibility,
    "stranded": _check_stranded,
    "x-max-priority": _check_amqp_queues,
}
