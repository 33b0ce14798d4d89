"""``dry_run=True`` on a real broker: the router's decisions travel in the headers, and the
broker, the app and the workers get exactly what plain Celery gives them."""

from __future__ import annotations

import contextlib
import copy
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner
from kombu import Message
from support.broker import drain
from support.services import close_app, running_worker

from priority_router import PriorityRouter, Transport, from_wire
from priority_router import headers as H
from priority_router.ops.cli import main
from priority_router.ops.doctor import diagnose
from workers.app import create_app

#: What install() changes on an app that is not in dry run.
WATCHED = (
    "worker_prefetch_multiplier",
    "task_acks_late",
    "broker_transport_options",
    "task_queue_max_priority",
)

#: (document id, client header, keyword arguments, publish options), in publish order.
DOCUMENTS: list[tuple[str, str | None, dict[str, Any], dict[str, Any]]] = [
    *[(f"d{n}", "acme", {}, {}) for n in range(4)],
    ("k1", None, {"client_id": "beta"}, {}),
    ("n1", None, {}, {}),
    ("e1", "acme", {}, {"priority": 3}),
    ("x1", "acme", {}, {"expires": 300}),
]


@pytest.fixture
def dry_env(worker_env: dict[str, str]) -> dict[str, str]:
    return {**worker_env, "PRIORITY_ROUTER_DRY_RUN": "true"}


@pytest.fixture
def plain_app(worker_env: dict[str, str]) -> Iterator[Callable[[str], Celery]]:
    """Apps of the document workers' configuration without any router, on ``queue``."""
    apps: list[Celery] = []

    def make(queue: str) -> Celery:
        app = create_app({**worker_env, "WORKERS_ROUTER": "off", "DOCUMENT_QUEUE": queue})
        apps.append(app)
        return app

    yield make
    for app in apps:
        with app.connection_for_write() as conn, contextlib.suppress(Exception):
            conn.default_channel.queue_delete(app.conf.task_default_queue)
        close_app(app)


def settings_of(app: Celery) -> dict[str, Any]:
    """The settings install() would change and every queue's declaration, as plain data."""
    return {
        **{key: copy.deepcopy(app.conf.get(key)) for key in WATCHED},
        "queues": {name: dict(q.queue_arguments or {}) for name, q in app.amqp.queues.items()},
        "max_priority": app.amqp.queues.max_priority,
    }


def publish_documents(app: Celery) -> None:
    for doc, client, kwargs, options in DOCUMENTS:
        headers = {"client_id": client} if client else {}
        if kwargs:
            app.send_task("workers.hold_document", kwargs={**kwargs, "document_id": doc, "seconds": 0})
        else:
            app.send_task("workers.hold_document", ("nobody", doc, 0), headers=headers, **options)


def by_document(messages: list[Message]) -> dict[str, Message]:
    found = {}
    for m in messages:
        args, kwargs, _ = m.decode()
        found[kwargs.get("document_id") or args[1]] = m
    return found


def wire(m: Message) -> tuple[object, object]:
    return m.properties.get("priority"), m.properties.get("expiration")


@pytest.mark.compat
def test_headers_carry_the_decision_and_the_wire_is_plain_celerys(
    plain_app: Callable[[str], Celery], dry_env: dict[str, str]
) -> None:
    plain = plain_app(f"plain-{uuid.uuid4().hex[:8]}")
    app = plain_app(dry_env["DOCUMENT_QUEUE"])
    before = settings_of(app)
    router = PriorityRouter.from_env(dry_env)
    router.install(app)
    assert router.config.dry_run
    assert settings_of(app) == before, "install() changed a setting"

    publish_documents(plain)
    publish_documents(app)  # builds the sender: the router settles again
    assert settings_of(app) == before, "settling changed a setting"
    assert settings_of(app) == {**settings_of(plain), "queues": settings_of(app)["queues"]}

    plain_messages = by_document(drain(plain, plain.conf.task_default_queue, expected=len(DOCUMENTS)))
    messages = by_document(drain(app, app.conf.task_default_queue, expected=len(DOCUMENTS)))
    assert set(messages) == set(plain_messages) == {d[0] for d in DOCUMENTS}
    assert {d: wire(m) for d, m in messages.items()} == {d: wire(m) for d, m in plain_messages.items()}
    assert wire(messages["n1"])[0] in (None, 0), "no priority, as plain Celery sends it"
    transport = Transport.AMQP if app.conf.broker_url.startswith("amqp") else Transport.REDIS
    if transport is Transport.AMQP:
        assert messages["x1"].properties.get("expiration") is not None, "Celery's TTL stays"

    seen = {
        d: (m.headers[H.REASON], m.headers[H.PRIORITY], m.headers[H.PENDING], m.headers[H.DRY_RUN])
        for d, m in messages.items()
    }
    assert seen == {
        "d0": ("counted", 1, 0, True),
        "d1": ("counted", 1, -1, True),
        "d2": ("counted", 1, -2, True),
        "d3": ("counted", 2, -3, True),
        "k1": ("counted", 1, 0, True),
        "n1": ("no-client", 5, None, True),
        "e1": ("explicit", from_wire(3, transport), -4, True),
        "x1": ("counted", 3, -5, True),
    }
    assert "'priority_router_dry_run': True" in messages["d3"].headers["kwargsrepr"]
    assert not any(k.startswith("priority_router") for m in plain_messages.values() for k in m.headers)
    assert router.peek("acme").pending == -5, "dry run counts every document"


def test_a_worker_in_dry_run_runs_everything_and_keeps_celerys_settings(
    dry_env: dict[str, str], key_prefix: str
) -> None:
    app = create_app(dry_env)
    try:
        with running_worker(dry_env, "--pool", "solo") as worker:
            results = [app.send_task("tests.record_request", headers={"client_id": "acme"}) for _ in range(6)]
            results.append(app.send_task("tests.record_request"))
            seen = [r.get(timeout=60) for r in results]
            confs = app.control.inspect(timeout=5).conf(with_defaults=False) or {}
            log = worker.output()
    finally:
        with contextlib.suppress(Exception), app.connection_for_write() as conn:
            conn.default_channel.queue_delete(dry_env["DOCUMENT_QUEUE"])
        close_app(app)

    assert sorted(s["pending"] for s in seen[:6]) == [-5, -4, -3, -2, -1, 0]
    assert {s["reason"] for s in seen[:6]} == {"counted"} and seen[6]["reason"] == "no-client"
    assert all(s["wire_priority"] in (None, 0) for s in seen), "plain Celery's priority"

    assert log.count("priority-router dry run on") == 1, log
    for unwanted in ("keeps your", "without a priority-router decision", "quorum", "refuse"):
        assert unwanted not in log, log
    (conf,) = [c for c in confs.values() if c.get("task_default_queue") == dry_env["DOCUMENT_QUEUE"]]
    assert "worker_prefetch_multiplier" not in conf and "task_acks_late" not in conf
    assert "priority_steps" not in (conf.get("broker_transport_options") or {})

    # The CLI reads the counts the dry run filled.
    runner = CliRunner()
    store = ["--redis-url", dry_env["PRIORITY_ROUTER_REDIS_URL"], "--key-prefix", key_prefix]
    inspected = runner.invoke(main, ["inspect", "acme", "--json", *store])
    assert inspected.exit_code == 0, inspected.output
    assert json.loads(inspected.output)["pending"] == -5
    status = runner.invoke(main, ["status", "--json", *store])
    assert [r["client_id"] for r in json.loads(status.output)] == ["acme"]


def test_doctor_says_dry_run_and_what_switching_on_would_set(
    plain_app: Callable[[str], Celery], dry_env: dict[str, str]
) -> None:
    app = plain_app(dry_env["DOCUMENT_QUEUE"])
    PriorityRouter.from_env(dry_env).install(app)
    findings = {f.check: f for f in diagnose(app)}
    assert [f for f in findings.values() if not f.ok] == []
    router = findings["router"]
    assert "dry run" in router.detail and "dry_run=False" in router.fix
    assert "worker_prefetch_multiplier=1 (now 4)" in findings["dry run"].detail
    assert "task_acks_late=True (now False)" in findings["dry run"].detail
    assert findings["prefetch"].detail.startswith("dry run, so not applied yet")
    assert "not checked" in findings["workers"].detail


def test_doctor_names_a_worker_in_dry_run_that_its_own_process_does_not(
    worker_env: dict[str, str], dry_env: dict[str, str]
) -> None:
    """Settings from the environment differ per process: a FastAPI trial's worker ran in
    dry run while doctor, run from another shell, said prefetch 1 and late acks. doctor
    now asks the workers consuming the app's queues for their own settings."""
    app = create_app(worker_env)  # the router on, not in dry run: the shell doctor runs in
    try:
        with running_worker(dry_env, "--pool", "threads", "--concurrency", "2") as worker:
            findings = diagnose(app)
            said = worker.output()[-2000:]
        failing = [f for f in findings if f.check == "workers" and not f.ok]
        # Its priority lists or its queue (blind), and what it takes ahead.
        assert len(failing) == 2, (findings, said)
        (ahead,) = [f for f in failing if "worker_prefetch_multiplier=4, task_acks_late=False" in f.detail]
        assert "dry run off" in ahead.fix
        assert all("dry run" in f.fix for f in failing)
        assert {f.check: f for f in findings}["prefetch"].ok, "the doctor's own app is fine"
    finally:
        close_app(app)
