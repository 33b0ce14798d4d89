"""The Celery and kombu internals the router uses (integration/celery_internals.py), against
the installed versions: each test fails when a release changes what the router relies on."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections.abc import Callable
from unittest import mock

import pytest
from celery import Celery
from celery.worker import state
from celery.worker.request import Request
from kombu.asynchronous import Hub
from kombu.message import Message

from priority_router.integration import celery_internals as internals


def _request(app: Celery, body: bytes = b"[[], {}, {}]") -> Request:
    message = Message(
        body=body,
        content_type="application/json",
        content_encoding="utf-8",
        headers={"id": "t-1", "task": "doc", "lang": "py", "client_id": "acme"},
        delivery_info={"exchange": "", "routing_key": "documents"},
        properties={"priority": 9},
        channel=mock.Mock(),
    )
    message.delivery_tag = 1
    return Request(message, app=app, task=app.tasks["doc"])


def _doc() -> None:
    pass


@pytest.fixture
def app() -> Celery:
    app = Celery("state", set_as_current=False)
    app.task(name="doc")(_doc)
    return app


def test_a_reserved_request_is_held_until_forgotten(app: Celery) -> None:
    request = _request(app)
    state.task_reserved(request)  # what Celery's strategy does on receipt
    try:
        assert request in internals.held_requests()
        assert internals.held_count() >= 1
        internals.forget(request)
        assert request not in internals.held_requests()
        assert request.id not in state.requests
    finally:
        state.task_ready(request)


def test_acknowledge_now_acks_the_message_once_and_celery_does_not_again(app: Celery) -> None:
    request = _request(app)
    on_ack = mock.Mock()
    request._on_ack = on_ack  # Celery's queued ack, which must not run
    internals.acknowledge_now(request)
    request.message.channel.basic_ack.assert_called_once_with(1, multiple=False)
    assert request.acknowledged
    request.acknowledge()  # Celery's own ack after the gate's: a no-op
    on_ack.assert_not_called()
    internals.acknowledge_now(request)
    request.message.channel.basic_ack.assert_called_once()


def test_a_request_exposes_its_message_and_headers(app: Celery) -> None:
    request = _request(app)
    assert request.message.headers["client_id"] == "acme"
    assert request.request_dict["client_id"] == "acme"
    request.request_dict["priority_router_gated"] = True  # what the gate marks for the end
    assert request.request_dict["priority_router_gated"] is True


def test_tasks_running_sees_a_task_on_any_threads_stack(app: Celery) -> None:
    seen: list[bool] = []

    @app.task(name="probe")
    def probe() -> None:
        seen.append(internals.tasks_running())

    assert internals.tasks_running() is False
    probe.apply()  # eagerly: the task is on this thread's stack while it runs
    assert seen == [True]
    assert internals.tasks_running() is False


def test_the_task_sender_is_built_once_by_its_builder_and_cached(app: Celery) -> None:
    amqp = app.amqp
    assert callable(internals.sender_builder(amqp))
    assert internals.SENDER not in amqp.__dict__
    sender = getattr(amqp, internals.SENDER)  # Celery's cached property builds it
    assert callable(sender) and amqp.__dict__[internals.SENDER] is sender


def test_set_by_user_tells_a_users_value_from_celerys_default() -> None:
    app = Celery("conf", set_as_current=False)
    app.conf.worker_prefetch_multiplier = 4
    app.conf.get("broker_url")  # loaded, as when the router settles on it
    assert internals.set_by_user(app.conf, "worker_prefetch_multiplier")
    assert not internals.set_by_user(app.conf, "task_acks_late")
    django = Celery("django", set_as_current=False)
    django.config_from_object({"CELERY_TASK_ACKS_LATE": True}, namespace="CELERY")
    django.conf.get("broker_url")
    assert internals.set_by_user(django.conf, "task_acks_late")
    assert not internals.set_by_user(django.conf, "worker_prefetch_multiplier")


def test_priority_list_names_kombus_redis_list_for_each_step() -> None:
    from kombu.transport.redis import Channel

    channel = mock.Mock(spec=Channel, sep="\x06\x16", priority_steps=[0, 3, 6, 9])
    channel.priority = Channel.priority.__get__(channel)
    channel._q_for_pri = Channel._q_for_pri.__get__(channel)
    assert internals.priority_list(channel, "documents", 0) == "documents"
    assert internals.priority_list(channel, "documents", 3) == "documents\x06\x163"


def test_step_list_is_the_list_a_channel_with_that_step_uses() -> None:
    from kombu.transport.redis import Channel

    for steps in ([0, 3, 6, 9], list(range(10))):
        channel = mock.Mock(spec=Channel, sep="\x06\x16", priority_steps=steps)
        channel.priority = Channel.priority.__get__(channel)
        channel._q_for_pri = Channel._q_for_pri.__get__(channel)
        for step in steps:
            assert internals.step_list(channel, "documents", step) == channel._q_for_pri("documents", step)
    assert internals.step_list(channel, "documents", 1) == "documents\x06\x161"


def test_pool_size_follows_an_autoscaled_prefork_pool_as_it_grows_and_shrinks() -> None:
    # A prefork pool forks: in a process of its own, not in the threaded test process.
    script = """
from types import SimpleNamespace
from celery.concurrency.prefork import TaskPool
from priority_router.integration.celery_internals import pool_size
pool = TaskPool(limit=1)
pool.start()
try:
    consumer = SimpleNamespace(pool=pool)
    seen = [pool_size(consumer)]
    pool.grow(2)  # what the autoscaler does
    seen.append(pool_size(consumer))
    pool.shrink(1)
    seen.append(pool_size(consumer))
finally:
    pool.terminate()
print(seen, pool_size(SimpleNamespace(pool=None)))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "[1, 3, 2] None"


def test_request_headers_is_the_mapping_the_task_sees_and_takes_a_mark(app: Celery) -> None:
    request = _request(app)
    headers = internals.request_headers(request)
    assert headers is not None and headers["client_id"] == "acme"
    headers["priority_router_gated"] = True
    assert internals.request_headers(request)["priority_router_gated"] is True  # type: ignore[index]
    assert internals.request_headers(object()) is None


def test_request_call_is_the_task_name_and_its_decoded_arguments(app: Celery) -> None:
    request = _request(app, b'[["d1"], {"client_id": "beta"}, {}]')
    assert internals.request_call(request) == ("doc", ("d1",), {"client_id": "beta"})
    assert internals.request_call(object()) is None


def test_a_consumers_hand_off_to_the_pool_can_be_wrapped_before_its_strategies_are_built(
    app: Celery,
) -> None:
    from celery.worker import strategy
    from celery.worker.consumer import Consumer

    pooled: list[object] = []
    consumer = Consumer(
        pooled.append, app=app, hostname="h", pool=mock.Mock(), timer=mock.Mock(), controller=mock.Mock()
    )
    kept: list[object] = []

    def keep_the_first(handle: Callable[[object], object]) -> Callable[[object], object]:
        return lambda request: kept.append(request) if len(kept) < 1 else handle(request)

    internals.wrap_task_requests(consumer, keep_the_first)
    # What a worker's strategies call (celery.worker.strategy.default reads it once, at start).
    handle = consumer.on_task_request
    handle("first")
    handle("second")
    assert kept == ["first"] and pooled == ["second"]
    assert "consumer.on_task_request" in inspect.getsource(strategy.default)


def test_a_workers_prefetch_multiplier_is_read_from_its_attribute_when_its_consumer_is_built(
    app: Celery,
) -> None:
    from celery.worker import components
    from celery.worker.worker import WorkController

    assert "prefetch_multiplier" in inspect.getsource(WorkController.setup_defaults)
    assert "w.prefetch_multiplier" in inspect.getsource(components.Consumer.create)
    worker = mock.Mock(prefetch_multiplier=4)
    assert internals.set_prefetch_multiplier(worker, 1) and worker.prefetch_multiplier == 1
    assert not internals.set_prefetch_multiplier(worker, 1)


def test_kombus_loop_reports_the_callbacks_queued_for_its_next_turn() -> None:
    hub = Hub()
    read, write = os.pipe()
    hub.add_reader(read, os.read, read, 1)
    try:
        assert not internals.loop_callbacks_queued(hub)
        hub.call_soon(lambda: None)
        assert internals.loop_callbacks_queued(hub)
        os.write(write, b"x")  # the loop's poll returns at once
        next(hub.create_loop())
        assert not internals.loop_callbacks_queued(hub)
    finally:
        hub.close()
        os.close(read)
        os.close(write)


def test_a_task_message_carries_its_task_sent_event_with_the_kwargs_shown(app: Celery) -> None:
    message = app.amqp.as_task_v2("t-1", "doc", kwargs={"pages": 3}, create_sent_event=True)
    event = internals.sent_event(message)
    assert event is not None and event["kwargs"] == message.headers["kwargsrepr"]
    assert internals.sent_event(app.amqp.as_task_v2("t-2", "doc")) is None


def test_kombus_redis_sweep_of_unacked_messages_is_called_as_its_loop_calls_it() -> None:
    from kombu.transport.redis import Channel, QoS

    assert {"num", "interval"} <= set(inspect.signature(QoS.restore_visible).parameters)
    assert hasattr(Channel, "unacked_restore_limit")
    channel = mock.Mock(unacked_restore_limit=7, unacked_restore_throttle=1)
    internals.restore_unacked(channel)
    channel.qos.restore_visible.assert_called_once_with(num=7, interval=1)
    app = Celery("a", broker="redis://127.0.0.1:1/0", set_as_current=False)
    assert internals.restore_interval(app) == getattr(Channel, "unacked_restore_interval", 10)
    app.conf.broker_transport_options = {"unacked_restore_interval": 2}
    assert internals.restore_interval(app) == 2


def test_kombus_redis_fetch_is_what_replace_fetch_replaces() -> None:
    """kombu's Redis channel fetches with ``_brpop_start`` and reads with ``_brpop_read``,
    through ``handlers``, and names its lists, unacked keys and errors where the reliable
    fetch reads them (``tests/contract/test_fetch.py`` runs it on a real Redis)."""
    from kombu.transport.redis import Channel

    assert set(inspect.signature(Channel._brpop_start).parameters) == {"self", "timeout"}
    assert "self" in inspect.signature(Channel._brpop_read).parameters
    source = inspect.getsource(Channel)
    for used in (
        "self.handlers = {'BRPOP': self._brpop_read",
        "self._queue_cycle",
        "self.ResponseError",
        "self.brpop_timeout",
        "self._in_poll = self.client.connection",
        "self.client.connection.send_command(",
        "self.client.parse_response(self.client.connection,",
    ):
        assert used in source, used
    for attribute in (
        "unacked_key",
        "unacked_index_key",
        "global_keyprefix",
        "priority_steps",
    ):
        assert hasattr(Channel, attribute), attribute


def test_the_fetch_keys_are_brpops_and_a_replaced_fetch_sends_and_reads_through_the_callers() -> None:
    from kombu.utils.scheduling import round_robin_cycle

    channel = mock.Mock(
        active_queues={"a", "b"}, priority_steps=[0, 5], global_keyprefix="p:", sep="\x06\x16"
    )
    channel._queue_cycle = round_robin_cycle(["a", "b"])
    channel._q_for_pri = lambda queue, pri: queue if pri == 0 else f"{queue}\x06\x16{pri}"
    channel.handlers = {}
    keys, idle = internals.fetch_keys(channel, 5)  # type: ignore[misc]
    assert keys == ["p:a", "p:b", "p:a\x06\x165", "p:b\x06\x165"] and idle == "p:a\x06\x165"
    kombu_read = channel._brpop_read
    internals.replace_fetch(channel, lambda: ["EVAL", "script"], lambda read: ("read", read()))
    channel._brpop_start()
    channel.client.connection.send_command.assert_called_once_with("EVAL", "script")
    assert channel._in_poll is channel.client.connection
    assert channel.handlers["BRPOP"] is channel._brpop_read
    assert channel._brpop_read(timeout=1) == ("read", kombu_read.return_value)
    kombu_read.assert_called_once_with(timeout=1)


def test_kombus_redis_qos_writes_its_unacked_record_then_keeps_the_message_as_the_virtual_qos_does() -> None:
    from kombu.transport import redis as kombu_redis
    from kombu.transport.virtual import QoS

    source = inspect.getsource(kombu_redis.QoS.append)
    assert (
        ".hset(self.unacked_key, delivery_tag" in source and "super().append(message, delivery_tag)" in source
    )
    qos = mock.Mock()
    qos.append = redis_append = mock.Mock()
    channel = mock.Mock(qos=qos)
    internals.record_in_process(channel, lambda message: message == "recorded")
    with mock.patch.object(QoS, "append") as virtual_append:
        channel.qos.append("recorded", "t1")
        channel.qos.append("other", "t2")
    virtual_append.assert_called_once_with(qos, "recorded", "t1")
    redis_append.assert_called_once_with("other", "t2")
