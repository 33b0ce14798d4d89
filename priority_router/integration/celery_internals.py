"""Every internal of Celery and kombu the router relies on, in one place: neither
documents these as public, so each has a test that fails when a release changes it
(``tests/unit/test_celery_internals.py``, run on every supported Celery by ``make matrix``).

- Celery's thread-local task stack (``celery._state._task_stack``): whether any thread of
  the process runs a task, read without Celery's per-lookup exception;
- Celery's lazily built task sender (``app.amqp._create_task_sender`` and the cached
  ``send_task_message``), which the router wraps (``sender.py``);
- Celery's settings chain (``conf.maps``, ``conf._to_keys``): whether the user set a key;
- kombu's Redis priority lists (``Channel._q_for_pri``, ``Channel.sep``): the key of a queue's list
  for a step, as the channel maps it or for every step;
- a worker's own state (``celery.worker.state.reserved_requests``, ``task_ready``) and a
  request's message (``Request.message``, ``Request.acknowledged``), which the gate uses;
- a request's headers as one mutable mapping (``Request.request_dict``), which the ends and
  the gate read and the gate marks;
- the consumer's hand-off of each request to the pool (``Consumer.on_task_request``), which
  the gate wraps;
- Celery's command line (``celery.bin.celery``, ``celery.bin.worker``, click's context):
  whether a ``celery worker`` command runs this, whose log is set up only later;
- the worker's prefetch multiplier (``WorkController.prefetch_multiplier``), which the
  consumer is built from after ``worker_init``;
- the consumer's prefetch window (``Consumer.qos``, ``Consumer.initial_prefetch_count``),
  which ``window.py`` widens by one document while documents are short;
- the callbacks kombu's event loop has queued for its next turn (``Hub._ready``), which
  ``solo_loop.py`` wakes the loop for;
- kombu's Redis sweep of unacknowledged messages past their visibility timeout
  (``QoS.restore_visible`` with the channel's ``unacked_restore_limit``,
  ``unacked_restore_throttle`` and ``unacked_restore_interval``), which ``green_restore.py``
  runs on green pools, where kombu's event loop does not;
- kombu's Redis fetch (``Channel._brpop_start`` sends a BRPOP of the lists
  ``Channel._queue_cycle`` and ``priority_steps`` name, ``Channel._brpop_read`` reads its
  reply, through ``Channel.handlers``; ``unacked_key``, ``unacked_index_key``,
  ``global_keyprefix``), which ``reliable_fetch.py`` replaces on a worker's task channel,
  and its ``QoS.append``, which writes the unacked record the fetch has written already;
- the ``task-sent`` event of a task message being sent (``task_message.sent_event``), whose
  ``kwargs`` the publish hook annotates as it does the ``kwargsrepr`` header.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from queue import Empty
from typing import Any

from celery._state import _task_stack
from celery.worker import state as _state

#: The modules of Celery's ``celery worker`` command and of the ``celery`` group it runs in.
WORKER_COMMAND = "celery.bin.worker"
CELERY_COMMAND = "celery.bin.celery"

#: The attribute of ``app.amqp`` that builds the task sender, and the cached sender's.
SENDER_BUILDER = "_create_task_sender"
SENDER = "send_task_message"


def tasks_running() -> bool:
    """Whether any thread of this process has a Celery task on its stack (eager or in a
    worker); an unknown layout of the stack means "maybe" (True)."""
    storage = getattr(getattr(_task_stack, "_local", None), "__storage__", None)
    return not isinstance(storage, dict) or bool(storage)


def sender_builder(amqp: Any) -> Callable[[], Callable[..., Any]]:
    """The function Celery calls once to build ``amqp``'s task sender."""
    build: Callable[[], Callable[..., Any]] = getattr(amqp, SENDER_BUILDER)
    return build


def set_by_user(conf: Any, key: str) -> bool:
    """Whether ``key`` is set in ``conf`` by the user rather than left at Celery's default.

    Celery's settings are a chain of maps ending with its defaults; a namespaced
    configuration (``CELERY_WORKER_PREFETCH_MULTIPLIER``) stores the key under its
    prefixed name, which ``_to_keys`` lists."""
    maps = getattr(conf, "maps", None)
    if not maps:
        return key in conf
    to_keys = getattr(conf, "_to_keys", None)
    names = tuple(to_keys(key)) if callable(to_keys) else (key,)
    return any(name in m for m in maps[:-1] for name in names)


def step_list(channel: Any, queue: str, step: int) -> str:
    """The Redis key (without ``global_keyprefix``) of ``queue``'s list for ``step``, as a
    channel whose ``priority_steps`` include it names it, whatever this channel's steps (a
    worker without the router polls only 0, 3, 6 and 9, and the router's lists are 0-9)."""
    return queue if step == 0 else f"{queue}{channel.sep}{step}"


def priority_list(channel: Any, queue: str, step: int) -> str:
    """The Redis key (without ``global_keyprefix``) of ``queue``'s list for priority ``step``
    on a kombu Redis ``channel``."""
    key: str = channel._q_for_pri(queue, step)
    return key


def held_requests() -> list[Any]:
    """The requests this worker process holds now (received, not yet ended)."""
    return list(_state.reserved_requests)


def held_count() -> int:
    return len(_state.reserved_requests)


def forget(request: Any) -> None:
    """The worker will not run ``request``: it is no longer reserved, active or scheduled."""
    _state.task_ready(request)


def acknowledge_now(request: Any) -> None:
    """Acknowledge ``request``'s message now, on the calling thread (the consumer's), and
    mark it acknowledged so Celery never acknowledges it again.  ``Request.acknowledge()``
    queues the ack on the worker's event loop instead, which on RabbitMQ sends it only at
    the loop's next wake-up.  Raises what kombu raises."""
    if request.acknowledged:
        return
    try:
        request.message.ack()
    finally:
        request.acknowledged = True


def pool_size(consumer: Any) -> int | None:
    """How many processes or threads the worker's pool has now (an autoscaled prefork
    pool grows and shrinks: billiard's ``Pool._processes``); None when unknown."""
    pool = getattr(consumer, "pool", None)
    for name in ("num_processes", "limit"):
        value = getattr(pool, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def request_headers(request: Any) -> dict[str, Any] | None:
    """``request``'s headers (and message properties) as the mapping the task will see:
    a mark written into it reaches the task's end.  None for an object without one."""
    headers = getattr(request, "request_dict", None)
    return headers if isinstance(headers, dict) else None


def request_call(request: Any) -> tuple[str, tuple[Any, ...], dict[str, Any]] | None:
    """The task name, args and kwargs of a worker's request (Celery decodes the body when
    the message arrives); None for an object without them."""
    name = getattr(request, "task_name", None)
    args = getattr(request, "args", None)
    kwargs = getattr(request, "kwargs", None)
    if not isinstance(name, str) or not isinstance(kwargs, dict):
        return None
    return name, tuple(args) if isinstance(args, list | tuple) else (), kwargs


def wrap_task_requests(consumer: Any, wrap: Callable[[Callable[[Any], Any]], Callable[[Any], Any]]) -> None:
    """Have ``consumer`` hand each request to ``wrap(its own hand-off)`` instead: the wrapper
    may run the request (calling the hand-off) or keep it from the pool (returning None)."""
    consumer.on_task_request = wrap(consumer.on_task_request)


def in_worker_command() -> bool:
    """Whether this runs inside Celery's ``celery worker`` command: loading the app for it,
    reading its options (which reads the app's configuration), or running the worker it
    starts.  Read from click's current context, the command's or its ``celery`` group's
    (``invoked_subcommand``), named by the module of the function each calls."""
    click = sys.modules.get("click")  # Celery's command line imports it; nothing else here does
    context = click.get_current_context(silent=True) if click is not None else None
    while context is not None:
        module = getattr(getattr(context.command, "callback", None), "__module__", None)
        if module == WORKER_COMMAND or (module == CELERY_COMMAND and context.invoked_subcommand == "worker"):
            return True
        context = context.parent
    return False


def set_prefetch_multiplier(worker: Any, multiplier: int) -> bool:
    """Give a starting worker (a ``WorkController`` at ``worker_init``) ``multiplier``
    before it builds its consumer; False when it already had it."""
    if getattr(worker, "prefetch_multiplier", multiplier) == multiplier:
        return False
    worker.prefetch_multiplier = multiplier
    return True


def resize_prefetch(consumer: Any, by: int) -> bool:
    """Change a started consumer's prefetch window by ``by`` documents (negative: narrow
    it), at the broker too; Celery's own changes (ETA documents) add and take
    their own, so the window moves by deltas.  False when it has no window (prefetch
    disabled), and nothing changes."""
    qos = getattr(consumer, "qos", None)
    if qos is None or not getattr(consumer, "initial_prefetch_count", 0):
        return False
    if by >= 0:
        qos.increment_eventually(by)
    else:
        qos.decrement_eventually(-by)
    qos.update()
    return True


def loop_callbacks_queued(hub: Any) -> bool:
    """Whether kombu's event loop ``hub`` has callbacks queued for its next turn."""
    return bool(hub._ready)


def sent_event(message: Any) -> dict[str, Any] | None:
    """The ``task-sent`` event Celery sends after publishing ``message`` (a task message as
    ``amqp.as_task_v2`` builds it), or None when task-sent events are off."""
    event = getattr(message, "sent_event", None)
    return event if isinstance(event, dict) else None


#: kombu's cadence of the sweep before it became settable (kombu 5.7): a call every 10 s,
#: a scan every 10th call.
KOMBU_RESTORE_EVERY = 10


def restore_unacked(channel: Any) -> None:
    """One call of kombu's sweep of ``channel``'s broker (Redis) for unacknowledged messages
    past their visibility timeout, each put back in its queue, as kombu's event loop timer
    calls it: at most ``unacked_restore_limit`` messages, a scan every
    ``unacked_restore_throttle`` calls, under kombu's lock shared by every worker."""
    channel.qos.restore_visible(
        num=channel.unacked_restore_limit,
        interval=getattr(channel, "unacked_restore_throttle", KOMBU_RESTORE_EVERY),
    )


def restore_interval(app: Any) -> float:
    """Seconds between calls of the sweep on ``app``'s Redis broker: its
    ``unacked_restore_interval`` transport option, else kombu's default."""
    from kombu.transport.redis import Channel

    options = app.conf.broker_transport_options or {}
    default = getattr(Channel, "unacked_restore_interval", KOMBU_RESTORE_EVERY)
    return float(options.get("unacked_restore_interval", default))


def task_channel(consumer: Any) -> Any:
    """The channel a started worker consumer takes its documents on (its task consumer's)."""
    return consumer.task_consumer.channel


def fetch_keys(channel: Any, step: int) -> tuple[list[str], str] | None:
    """The keys kombu's BRPOP on ``channel`` would name now, with the broker's global key
    prefix and in its order (each queue's priority lists, most urgent first, the queues in
    kombu's fair cycle), and its first queue's list for priority ``step``; None when it
    consumes no queue."""
    queues = channel._queue_cycle.consume(len(channel.active_queues))
    if not queues:
        return None
    prefix = channel.global_keyprefix or ""
    keys = [prefix + channel._q_for_pri(queue, pri) for pri in channel.priority_steps for queue in queues]
    return keys, prefix + channel._q_for_pri(queues[0], step)


def unacked_keys(channel: Any) -> tuple[str, str]:
    """kombu's unacked index and hash of ``channel``, with the broker's global key prefix."""
    prefix = channel.global_keyprefix or ""
    return prefix + channel.unacked_index_key, prefix + channel.unacked_key


def replace_fetch(
    channel: Any, command: Callable[[], list[Any] | None], read: Callable[[Callable[[], Any]], Any]
) -> None:
    """Have kombu's Redis ``channel`` fetch with the command ``command()`` gives (sent on the
    channel's connection as kombu sends its BRPOP; None: no queue to fetch from, nothing
    sent), and read each reply with ``read(kombu's own read)``, which raises
    ``queue.Empty`` for a reply without a message.  kombu's read parses the reply as BRPOP's
    ([list, message] or nil) and delivers the message."""
    kombu_read = channel._brpop_read

    def brpop_start(timeout: float | None = None) -> None:
        args = command()
        if args is None:
            return
        connection = channel.client.connection
        channel._in_poll = connection
        channel._brpop_sent_at = time.monotonic()  # kombu 5.7's check of an overdue reply
        connection.send_command(*args)

    def brpop_read(**options: Any) -> Any:
        return read(lambda: kombu_read(**options))

    channel._brpop_start = brpop_start
    channel._brpop_read = brpop_read
    channel.handlers["BRPOP"] = brpop_read


def record_in_process(channel: Any, recorded: Callable[[Any], bool]) -> None:
    """Have kombu's Redis ``channel`` keep each message ``recorded(message)`` says is in
    its unacked hash and index already in the process's own state only (kombu's virtual
    ``QoS.append``, which the Redis ``QoS.append`` calls after writing both)."""
    from kombu.transport.virtual import QoS

    qos = channel.qos
    redis_append = qos.append

    def append(message: Any, delivery_tag: Any) -> None:
        if recorded(message):
            QoS.append(qos, message, delivery_tag)  # type: ignore[no-untyped-call]  # kombu is untyped
        else:
            redis_append(message, delivery_tag)

    qos.append = append


def broker_refusal(channel: Any) -> type[Exception]:
    """The error kombu's Redis ``channel`` raises for a command the broker refused."""
    error: type[Exception] = channel.ResponseError
    return error


def read_other(channel: Any, command: str) -> None:
    """Read the reply of ``command`` (not a fetch) that ``replace_fetch``'s start sent, as
    kombu reads a BRPOP's (a connection error drops the connection for the next turn to
    reconnect), and raise ``queue.Empty``: no message came."""
    try:
        try:
            channel.client.parse_response(channel.client.connection, command)
        except channel.connection_errors:
            channel.client.connection.disconnect()
            raise
    finally:
        channel._in_poll = None
        flush = getattr(channel, "_flush_brpop_reauth", None)  # kombu 5.7
        if flush is not None:
            flush()
    raise Empty()
