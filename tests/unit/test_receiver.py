"""The receiver called with exactly what Celery's ``before_task_publish`` passes."""

from __future__ import annotations

import logging
from typing import Any

import fakeredis
import pytest
from celery import Celery
from celery._state import _task_stack
from support.publishing import publishing_as

from priority_router import PriorityRouter, Transport, to_wire
from priority_router import headers as H
from priority_router.integration.publish import PublishReceiver
from priority_router.router import engine_of


@pytest.fixture
def app() -> Celery:
    # Nothing connects: install() only reads the URL to pick the transport.
    return Celery("unit", broker="redis://127.0.0.1:1/0", set_as_current=False)


@pytest.fixture
def router() -> PriorityRouter:
    return PriorityRouter(redis_client=fakeredis.FakeRedis())


def publish(
    receiver: PublishReceiver,
    app: Celery,
    task: str = "docs.process",
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    headers: dict[str, Any] | None = None,
    priority: int | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    message_headers = {"lang": "py", "task": task, "id": "t-1", "retries": 0, **(headers or {})}
    properties: dict[str, Any] = {"correlation_id": "t-1", "reply_to": ""}
    if priority is not None:
        properties["priority"] = priority
    with publishing_as(app):
        receiver(
            sender=task,
            body=(list(args), kwargs or {}, {"callbacks": None, "errbacks": None, "chain": None}),
            exchange="",
            routing_key="celery",
            declare=[],
            headers=message_headers,
            properties=properties,
            retry_policy={},
            signal=object(),
        )
    return message_headers, properties


def test_header_client_is_counted(app: Celery, router: PriorityRouter) -> None:
    receiver = router.install(app)
    for _ in range(3):
        publish(receiver, app, headers={"client_id": "acme"})
    headers, properties = publish(receiver, app, headers={"client_id": "acme"})
    assert properties["priority"] == 2
    assert headers[H.PRIORITY] == 2 and headers[H.PENDING] == -3
    assert headers["client_id"] == "acme" and headers[H.REASON] == "counted"
    assert isinstance(headers[H.PUBLISHED_AT], float)


def test_header_wins_over_kwarg_which_wins_over_getter(app: Celery) -> None:
    seen: list[str] = []

    def getter(task: str, args: tuple[Any, ...], kwargs: dict[str, Any], headers: dict[str, Any]) -> str:
        seen.append(task)
        return "from-getter"

    router = PriorityRouter(redis_client=fakeredis.FakeRedis(), client_id_getter=getter)
    receiver = router.install(app)
    h, _ = publish(receiver, app, kwargs={"client_id": "kw"}, headers={"client_id": "hdr"})
    assert h["client_id"] == "hdr"
    h, _ = publish(receiver, app, kwargs={"client_id": "kw"})
    assert h["client_id"] == "kw"
    h, _ = publish(receiver, app, args=("doc-1",))
    assert h["client_id"] == "from-getter" and seen == ["docs.process"]


def test_no_client_gets_default_priority_never_none(app: Celery, router: PriorityRouter) -> None:
    receiver = router.install(app)
    headers, properties = publish(receiver, app, kwargs={"client_id": None})
    assert properties["priority"] == 5
    assert headers[H.REASON] == "no-client" and "client_id" not in headers


def test_failing_getter_is_logged_and_treated_as_no_client(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    def getter(*_: Any) -> str:
        raise KeyError("boom")

    receiver = PriorityRouter(redis_client=fakeredis.FakeRedis(), client_id_getter=getter).install(app)
    with caplog.at_level(logging.ERROR, "priority_router"):
        _, properties = publish(receiver, app)
    assert properties["priority"] == 5
    assert "client_id_getter failed" in caplog.text


def test_tasks_filter_leaves_other_tasks_uncounted(app: Celery) -> None:
    router = PriorityRouter(redis_client=fakeredis.FakeRedis(), tasks=["docs.*"])
    receiver = router.install(app)
    headers, properties = publish(receiver, app, task="maintenance.vacuum", headers={"client_id": "acme"})
    assert properties["priority"] == 5 and H.PRIORITY not in headers
    _, properties = publish(receiver, app, task="maintenance.vacuum", priority=0)
    assert properties["priority"] == 0, "an explicit priority on an uncounted task is kept"
    assert router.peek("acme").pending == 0
    publish(receiver, app, task="docs.ocr", headers={"client_id": "acme"})
    publish(receiver, app, task="docs.ocr", headers={"client_id": "acme"})
    assert router.peek("acme").pending == -1


def test_retry_keeps_priority_and_is_not_counted(app: Celery, router: PriorityRouter) -> None:
    receiver = router.install(app)
    for _ in range(5):
        first, _ = publish(receiver, app, headers={"client_id": "acme"})
    retry_headers = {k: v for k, v in first.items() if k.startswith(("priority_router", "client_id"))}
    headers, properties = publish(receiver, app, headers={**retry_headers, "retries": 1})
    assert properties["priority"] == first[H.PRIORITY] == 2
    assert headers[H.REASON] == "inherited"
    assert router.peek("acme").pending == -4


class _FakeRequest:
    called_directly = False
    is_eager = False

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


class _RunningTask:
    def __init__(self, **request: Any) -> None:
        self.request = _FakeRequest(**request)


def test_child_of_same_client_inherits_and_is_not_counted(app: Celery, router: PriorityRouter) -> None:
    receiver = router.install(app)
    parent = _RunningTask(client_id="acme", priority_router_priority=7, priority_router_pending=-13)
    _task_stack.push(parent)
    try:
        same, same_props = publish(receiver, app, headers={"client_id": "acme", "parent_id": "p"})
        anon, anon_props = publish(receiver, app, headers={"parent_id": "p"})
        other, other_props = publish(receiver, app, headers={"client_id": "beta", "parent_id": "p"})
    finally:
        _task_stack.pop()
    assert same_props["priority"] == anon_props["priority"] == 7
    assert same[H.REASON] == anon[H.REASON] == "inherited" and anon["client_id"] == "acme"
    assert other_props["priority"] == 1 and other[H.REASON] == "counted"
    assert router.peek("acme").pending == 0, "children are not new documents"
    assert router.peek("beta").pending == 0 and engine_of(router).counter.read("beta").ttl_ms is not None


def test_a_failed_counter_prices_publishes_by_the_process_own_counts_with_one_warning(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    router = PriorityRouter(redis_url="redis://127.0.0.1:1/0", cooldown=60, mode="inflight")
    receiver = router.install(app)
    with caplog.at_level(logging.WARNING, "priority_router"):
        giant = [publish(receiver, app, headers={"client_id": "giant"}) for _ in range(25)]
        light = [publish(receiver, app, headers={"client_id": f"c{i}"}) for i in range(20)]
        explicit, explicit_props = publish(receiver, app, headers={"client_id": "giant"}, priority=3)
    # The giant sinks as the scheme's table says; each light client is at 0, most urgent.
    sinking = [1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7] + [8] * 6 + [9] * 4
    assert [h[H.PRIORITY] for h, _ in giant] == sinking
    assert [h[H.PENDING] for h, _ in giant] == [-n for n in range(25)]
    assert all(
        (h[H.PRIORITY], h[H.PENDING], p["priority"]) == (1, 0, to_wire(1, Transport.REDIS)) for h, p in light
    )
    assert all(h[H.REASON] == "local" for h, _ in giant + light)
    # Uncounted by the store: nothing for a worker to end, and the count is shown as local.
    assert not any(H.INFLIGHT in h for h, _ in giant + light)
    # A caller's own priority is kept, without a count the store did not keep.
    assert (explicit[H.REASON], explicit[H.PENDING], explicit_props["priority"]) == ("explicit", None, 3)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "own counts" in warnings[0].getMessage()


def test_receiver_ignores_other_apps_publishes(app: Celery, router: PriorityRouter) -> None:
    receiver = router.install(app)
    other = Celery("other", broker="redis://127.0.0.1:1/0", set_as_current=False)
    headers: dict[str, Any] = {"client_id": "acme"}
    properties: dict[str, Any] = {}
    with publishing_as(other):
        receiver(sender="t", body=((), {}, {}), headers=headers, properties=properties)
    assert properties == {} and headers == {"client_id": "acme"}
    assert router.peek("acme").pending == 0


def test_explicit_priority_reaches_the_broker_and_is_still_counted(
    app: Celery, router: PriorityRouter
) -> None:
    receiver = router.install(app)
    headers, properties = publish(receiver, app, headers={"client_id": "new"}, priority=9)
    assert properties["priority"] == 9, "the caller's priority is not overwritten"
    assert headers[H.REASON] == "explicit" and headers[H.PRIORITY] == 9
    assert router.peek("new").pending == 0 and engine_of(router).counter.read("new").ttl_ms is not None
    for _ in range(25):
        publish(receiver, app, headers={"client_id": "heavy"})
    _, properties = publish(receiver, app, headers={"client_id": "heavy"}, priority=0)
    assert properties["priority"] == 0
    assert router.peek("heavy").pending == -25


def test_explicit_priority_without_a_client_is_kept(app: Celery, router: PriorityRouter) -> None:
    receiver = router.install(app)
    headers, properties = publish(receiver, app, priority=9)
    assert properties["priority"] == 9 and headers[H.REASON] == "explicit"


def test_app_default_priority_is_not_a_choice(router: PriorityRouter) -> None:
    app = Celery("unit", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.task_default_priority = 3
    receiver = router.install(app)
    for _ in range(24):
        headers, properties = publish(receiver, app, headers={"client_id": "heavy"}, priority=3)
    assert properties["priority"] == 9 and headers[H.REASON] == "counted"
    headers, properties = publish(receiver, app, priority=3)
    assert properties["priority"] == 3, "documents without a client keep the app's default"
    assert headers[H.REASON] == "no-client" and headers[H.PRIORITY] == 3


def test_explicit_child_priority_wins_over_inheritance(app: Celery, router: PriorityRouter) -> None:
    receiver = router.install(app)
    parent = _RunningTask(client_id="acme", priority_router_priority=7, priority_router_pending=-13)
    _task_stack.push(parent)
    try:
        headers, properties = publish(receiver, app, headers={"parent_id": "p"}, priority=5)
    finally:
        _task_stack.pop()
    assert properties["priority"] == 5 and headers[H.REASON] == "inherited"
    assert router.peek("acme").pending == 0, "a chain step is not a new document"


def test_expires_does_not_become_a_rabbitmq_ttl(router: PriorityRouter) -> None:
    amqp_app = Celery("unit", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False)
    receiver = router.install(amqp_app)
    message_headers = {"task": "t", "id": "x", "expires": "2030-01-01T00:00:00+00:00"}
    properties: dict[str, Any] = {"expiration": 5.0}
    with publishing_as(amqp_app):
        receiver(sender="t", body=((), {}, {}), headers=message_headers, properties=properties)
    assert "expiration" not in properties and properties["priority"] == 5


def test_a_child_inherits_its_parents_priority_not_the_app_default(router: PriorityRouter) -> None:
    app = Celery("unit", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.task_default_priority = 5
    receiver = router.install(app)
    parent = _RunningTask(client_id="acme", priority_router_priority=2, priority_router_pending=-3)
    _task_stack.push(parent)
    try:
        headers, properties = publish(receiver, app, headers={"parent_id": "p"}, priority=5)
    finally:
        _task_stack.pop()
    assert properties["priority"] == 2 and headers[H.PRIORITY] == 2 and headers[H.REASON] == "inherited"


def test_send_task_by_name_without_a_client_still_gets_a_priority(router: PriorityRouter) -> None:
    app = Celery("unit", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.task_default_priority = 3
    receiver = router.install(app)
    # Celery puts the default only on tasks registered in the publishing app.
    _, properties = publish(receiver, app, task="elsewhere.registered")
    assert properties["priority"] == 5, "a message without a priority would be served first on Redis"
