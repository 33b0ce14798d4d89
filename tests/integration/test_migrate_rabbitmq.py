"""``priority-router migrate QUEUE --to router|plain`` on a live RabbitMQ queue: real
publishers that keep publishing, real workers of the old kind consuming it, the command
run as the operator runs it, and every document counted, exactly once.

The kill matrix (``-m matrix``, not run by ``make test``) SIGKILLs the command right after
each of its steps and in the middle of its moves, runs it again, and counts every
document of the backlog and of the live publisher once in the new queue.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import amqp
import pytest
from amqp.exceptions import NotFound, PreconditionFailed
from click.testing import CliRunner
from support.rabbitmq_migration import (
    Publisher,
    publish_backlog,
    queue_contents,
    ran,
    run_migrate,
)
from support.services import (
    ROOT,
    Worker,
    close_app,
    counter_db_url,
    temporary_vhost,
    worker_command,
    worker_environment,
)

from priority_router import Transport, to_wire
from priority_router import headers as H
from priority_router.integration.publisher_pause import migrations_key
from priority_router.ops.cli import main
from priority_router.ops.migrate_rabbitmq import HOLDING_SUFFIX, KILL_ENV, Migration, migrate
from priority_router.ops.migration import Target
from priority_router.ops.rabbitmq_queue import LOCK_SUFFIX
from workers.app import create_app

pytestmark = pytest.mark.rabbitmq

#: Longest a publish may be held: the grace period, the swap, and slack for a shared machine.
STALL_BOUND = 4.0


@pytest.fixture(scope="module")
def vhost_url(amqp_url: str) -> Iterator[str]:
    with temporary_vhost(amqp_url, "pr-migrate") as url:
        yield url


class Case:
    """One queue on the test vhost, its environment, and the broker as the test sees it."""

    def __init__(self, url: str, redis_url: str, prefix: str, workdir: Path) -> None:
        self.url = url
        self.queue = f"docs-{uuid.uuid4().hex[:8]}"
        self.tag = uuid.uuid4().hex[:6]
        self.workdir = workdir
        self.env = {
            "BROKER_URL": url,
            "DOCUMENT_QUEUE": self.queue,
            "PRIORITY_ROUTER_REDIS_URL": redis_url,
            "PRIORITY_ROUTER_KEY_PREFIX": prefix,
            "PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL": "0",
        }
        self.processes: list[Any] = []

    def env_of(self, router: bool, **extra: str) -> dict[str, str]:
        return {**self.env, "WORKERS_ROUTER": "on" if router else "off", **extra}

    def backlog(self, router: bool, count: int, seconds: float = 0.0) -> list[str]:
        app = create_app(self.env_of(router))
        try:
            return publish_backlog(app, count, self.tag, seconds)
        finally:
            close_app(app)

    def worker(self, router: bool, *args: str) -> Worker:
        worker = Worker(self.env_of(router), *args)
        self.processes.append(worker)
        worker.wait_ready()
        return worker

    def publisher(self, rate: float = 50.0) -> Publisher:
        publisher = Publisher(self.env_of(True, PUBLISHER_TAG=self.tag), self.workdir, rate)
        self.processes.append(publisher)
        publisher.wait_ready()
        return publisher

    def migrate(self, target: str, *extra: str, kill: str | None = None) -> tuple[Any, Any, float]:
        env = self.env_of(True, **({KILL_ENV: kill} if kill else {}))
        return run_migrate(env, self.queue, target, "--json", *extra)

    def channel(self) -> tuple[amqp.Connection, Any]:
        conn = _connection(self.url)
        return conn, conn.channel()

    def kind(self, name: str | None = None) -> str:
        """ "missing", "priority" or "plain": which declaration the queue takes."""
        conn, channel = self.channel()
        try:
            try:
                channel.queue_declare(queue=name or self.queue, passive=True)
            except NotFound:
                return "missing"
            channel = conn.channel()
            try:
                channel.queue_declare(
                    queue=name or self.queue,
                    durable=True,
                    auto_delete=False,
                    arguments={"x-max-priority": 10},
                )
                return "priority"
            except PreconditionFailed:
                return "plain"
        finally:
            conn.close()

    def drain(self, expected: int, timeout: float = 10) -> list[Any]:
        messages: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(messages) < expected and time.monotonic() < deadline:
            messages += queue_contents(self.url, self.queue)
            time.sleep(0.1)
        return messages + queue_contents(self.url, self.queue)

    def cleanup(self) -> None:
        for process in self.processes:
            with contextlib.suppress(Exception):
                process.stop()
        conn, channel = self.channel()
        try:
            for name in (self.queue, self.queue + HOLDING_SUFFIX):
                channel.queue_delete(queue=name)
        finally:
            conn.close()


def _connection(url: str) -> amqp.Connection:
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    conn = amqp.Connection(
        f"{parts.hostname}:{parts.port or 5672}",
        userid=parts.username or "guest",
        password=parts.password or "guest",
        virtual_host=unquote(parts.path[1:]) or "/",
    )
    conn.connect()
    return conn


@pytest.fixture
def case(
    vhost_url: str, redis_server_url: str, real_redis: Any, key_prefix: str, tmp_path: Path
) -> Iterator[Case]:
    made = Case(vhost_url, counter_db_url(redis_server_url), key_prefix, tmp_path)
    try:
        yield made
    finally:
        made.cleanup()


def _ids(messages: list[Any]) -> collections.Counter[str]:
    return collections.Counter(str(m.properties["application_headers"]["id"]) for m in messages)


def _wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def _actions(report: dict[str, Any]) -> list[str]:
    return [s["action"] for s in report["steps"]]


# -- end to end, with real workers -------------------------------------------------------


def test_to_router_moves_a_live_plain_queue_with_its_workers_and_publishers(case: Case) -> None:
    # 300 documents of 0.2 s keep two threads busy for 30 s: a backlog is still there when
    # the move starts, however fast the machine, so the move prices the plain ones.
    backlog = case.backlog(router=False, count=300, seconds=0.2)
    plain = case.worker(False, "-P", "threads", "-c", "2")
    publisher = case.publisher()
    time.sleep(1)

    done, report, _ = case.migrate("router")

    assert done.returncode == 0, done.stderr
    assert _actions(report) == [
        "found",
        "declared holding queue",
        "stopped consumers",
        "waited for workers",
        "moved out",
        "paused publishers",
        "moved out",
        "deleted",
        "declared",
        "bound",
        "resumed publishers",
        "moved back",
        "deleted holding queue",
    ]
    assert case.kind() == "priority" and case.kind(case.queue + HOLDING_SUFFIX) == "missing"
    assert f"Canceling queue {case.queue}" in plain.output()
    assert any("or else wire priority 5" in n for n in report["notes"])
    time.sleep(1)
    publisher.finish()
    sent = publisher.sent_ids()
    assert max(p.seconds for p in publisher.publishes()) < STALL_BOUND

    routed = case.worker(True, "-P", "threads", "-c", "8")
    wanted = set(backlog) | set(sent)
    _wait_for(lambda: set(ran(plain.output(), routed.output())) >= wanted, 60, "every document runs")
    time.sleep(0.5)
    runs = ran(plain.output(), routed.output())
    assert set(runs) == wanted and set(runs.values()) == {1}

    # What a plain worker restarted as it was sees: the queue is a priority queue now.
    said = _restarted_as_it_was(case, router=False)
    assert "PRECONDITION_FAILED - inequivalent arg 'x-max-priority'" in said
    assert "received none but current is the value '10'" in said


def test_to_plain_moves_a_live_priority_queue_with_its_workers_and_publishers(case: Case) -> None:
    backlog = case.backlog(router=True, count=300, seconds=0.02)
    routed = case.worker(True, "-P", "threads", "-c", "2")
    publisher = case.publisher()
    time.sleep(1)

    done, report, _ = case.migrate("plain")

    assert done.returncode == 0, done.stderr
    assert "resumed publishers" in _actions(report) and report["moved"] > 0
    assert case.kind() == "plain"
    assert f"Canceling queue {case.queue}" in routed.output()
    time.sleep(1)
    publisher.finish()
    sent = publisher.sent_ids()
    assert max(p.seconds for p in publisher.publishes()) < STALL_BOUND

    plain = case.worker(False, "-P", "threads", "-c", "8")
    wanted = set(backlog) | set(sent)
    _wait_for(lambda: set(ran(routed.output(), plain.output())) >= wanted, 60, "every document runs")
    time.sleep(0.5)
    runs = ran(routed.output(), plain.output())
    assert set(runs) == wanted and set(runs.values()) == {1}

    # A router worker restarted as it was refuses the queue, naming the way back.
    assert f"priority-router migrate {case.queue} --to router" in _restarted_as_it_was(case, router=True)


def _restarted_as_it_was(case: Case, router: bool) -> str:
    """What a worker of the old kind, started again after the migration, prints as it fails."""
    restarted = subprocess.run(
        worker_command("--pool", "solo"),
        cwd=ROOT,
        env=worker_environment(case.env_of(router)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert restarted.returncode != 0
    return restarted.stdout + restarted.stderr


# -- cut off, and run again ----------------------------------------------------------------


def test_killed_with_the_queue_deleted_loses_nothing_and_a_rerun_finishes(
    case: Case, real_redis: Any
) -> None:
    """The worst moment: the queue is gone.  Held publishers wait until the mark dies with
    the command, declare the queue as they know it and publish; the rerun moves all."""
    backlog = case.backlog(router=False, count=250)
    publisher = case.publisher()

    done, _, _ = case.migrate("router", kill="deleted")

    assert done.returncode == -9
    _wait_for(
        lambda: "stopped before it finished" in publisher.output(),
        15,
        "the publisher says the migration stopped",
    )
    _wait_for(lambda: case.kind() == "plain", 5, "the publisher declares the queue again, as it knows it")
    done, report, _ = case.migrate("router")
    assert done.returncode == 0, done.stderr
    assert "declared holding queue" not in _actions(report) and "moved back" in _actions(report)
    publisher.finish()
    sent = publisher.sent_ids()
    counted = _ids(case.drain(len(backlog) + len(sent)))
    assert set(counted) == set(backlog) | set(sent) and set(counted.values()) == {1}
    assert case.kind(case.queue + HOLDING_SUFFIX) == "missing"
    assert not real_redis.hlen(migrations_key(case.env["PRIORITY_ROUTER_KEY_PREFIX"]))


@pytest.mark.matrix
@pytest.mark.parametrize("target", ["router", "plain"])
@pytest.mark.parametrize(
    "point",
    [
        "found",
        "declared holding queue",
        "stopped consumers",
        "waited for workers",
        "out-batch:1",
        "out-mid-batch:2",
        "moved out#1",
        "paused publishers",
        "moved out#2",
        "deleted",
        "declared",
        "bound",
        "resumed publishers",
        "back-mid-batch:1",
        "back-batch:1",
        "moved back",
        "deleted holding queue",
    ],
)
def test_killed_at_any_point_a_rerun_finishes_and_counts_each_document_once(
    case: Case, real_redis: Any, target: str, point: str
) -> None:
    backlog = case.backlog(router=target == "plain", count=450)
    publisher = case.publisher()

    done, _, _ = case.migrate(target, kill=point)
    assert done.returncode == -9, done.stderr
    done, _, _ = case.migrate(target)
    assert done.returncode == 0, done.stderr
    again, repeat, _ = case.migrate(target)
    assert again.returncode == 0 and not repeat["changed"]

    time.sleep(0.5)
    publisher.finish()
    sent = publisher.sent_ids()
    counted = _ids(case.drain(len(backlog) + len(sent)))
    assert set(counted) == set(backlog) | set(sent) and set(counted.values()) == {1}
    assert case.kind() == ("priority" if target == "router" else "plain")
    assert case.kind(case.queue + HOLDING_SUFFIX) == "missing"
    assert not real_redis.hlen(migrations_key(case.env["PRIORITY_ROUTER_KEY_PREFIX"]))


# -- what is moved, what is planned, what is refused --------------------------------------


def test_messages_keep_their_properties_unrouted_ones_get_the_default_and_dry_run_ones_their_decision(
    case: Case,
) -> None:
    conn, channel = case.channel()
    channel.queue_declare(queue=case.queue, durable=True, auto_delete=False)
    sent = [
        amqp.Message(
            b'{"n": 1}',
            content_type="application/json",
            content_encoding="utf-8",
            application_headers={"id": "plain-0", "custom": [1, "x"]},
            correlation_id="c-0",
            delivery_mode=2,
            priority=0,
        ),
        amqp.Message(
            b"\x00\xffraw",
            content_type="application/x-binary",
            application_headers={"id": "routed-7", H.REASON: "counted"},
            correlation_id="c-1",
            delivery_mode=1,
            priority=7,
            reply_to="r",
            message_id="m-1",
        ),
        amqp.Message(b"none", application_headers={"id": "no-priority"}),
        # A router in dry run decides and leaves Celery's priority (none) on the message.
        amqp.Message(
            b"dry",
            application_headers={"id": "dry-1", H.REASON: "counted", H.DRY_RUN: True, H.PRIORITY: 1},
        ),
        amqp.Message(
            b"dry",
            application_headers={"id": "dry-bad", H.REASON: "counted", H.DRY_RUN: True, H.PRIORITY: "x"},
        ),
    ]
    for message in sent:
        channel.basic_publish(message, exchange="", routing_key=case.queue)
    conn.close()

    result = CliRunner().invoke(
        main, ["migrate", case.queue, "--to", "router", "-b", case.url, "--publishers-stopped", "--json"]
    )

    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["moved"] == 5 and "paused publishers" not in _actions(report)
    # Each move is a step with its own count: out to the holding queue, then back.
    moves = [(s["action"], s["messages"]) for s in report["steps"] if "moved" in s["action"]]
    assert moves == [("moved out", 5), ("moved out", 0), ("moved back", 5)]
    moved = {m.properties["application_headers"]["id"]: m for m in case.drain(5)}
    for original in sent:
        got = moved[original.properties["application_headers"]["id"]]
        assert got.body == original.body
        expected = dict(original.properties)
        if not expected.get("priority"):
            expected["priority"] = 5  # published without the router: the router's default
        assert got.properties == expected | (
            {"priority": to_wire(1, Transport.AMQP)}  # what its dry run decided, else behind everything
            if got.properties["application_headers"]["id"] == "dry-1"
            else {}
        )


def test_dry_run_plans_and_changes_nothing(case: Case) -> None:
    case.backlog(router=False, count=20)

    done, report, _ = case.migrate("router", "--dry-run")

    assert done.returncode == 0, done.stderr
    assert report["dry_run"] and report["changed"] and report["moved"] == 0
    assert _actions(report)[:4] == ["declare holding queue", "stop consumers", "wait for workers", "move out"]
    assert "is a plain queue with 20 message(s)" in report["notes"][0]
    assert case.kind(case.queue + HOLDING_SUFFIX) == "missing"
    assert len(case.drain(20)) == 20
    assert case.kind() == "plain"


def test_without_a_router_to_pause_publishers_it_refuses_unless_told_they_are_stopped(case: Case) -> None:
    case.backlog(router=False, count=5)

    refused = CliRunner().invoke(main, ["migrate", case.queue, "--to", "router", "-b", case.url])

    assert refused.exit_code == 2
    assert "--publishers-stopped" in refused.output and "would be lost" in refused.output
    assert case.kind() == "plain"


def test_a_publisher_that_fell_back_to_the_plain_queue_declares_it_with_priorities_again(
    case: Case, caplog: pytest.LogCaptureFixture
) -> None:
    # Declared outside kombu: a plain app in this process would share the router app's
    # pooled connection, and with it kombu's note that the queue is declared.
    conn, channel = case.channel()
    channel.queue_declare(queue=case.queue, durable=True, auto_delete=False)
    conn.close()
    app = create_app(case.env_of(True))
    try:
        app.send_task("workers.hold_document", ("acme", "before", 0), headers={"client_id": "acme"})
        done, _, _ = case.migrate("router")
        assert done.returncode == 0, done.stderr
        with app.producer_or_acquire() as producer:
            # What a reconnection does: the publisher declares its queues again.
            producer.connection.declared_entities.clear()
        with caplog.at_level(logging.INFO, "priority_router"):
            app.send_task("workers.hold_document", ("acme", "after", 0), headers={"client_id": "acme"})
    finally:
        close_app(app)
    assert any("is a priority queue again" in r.getMessage() for r in caplog.records)
    messages = case.drain(2)
    assert len(messages) == 2 and all(m.properties["priority"] > 0 for m in messages)
    assert case.kind() == "priority"


def test_a_second_run_at_the_same_time_is_refused(case: Case) -> None:
    case.backlog(router=False, count=1)
    conn, channel = case.channel()
    try:
        channel.queue_declare(queue=case.queue + LOCK_SUFFIX, exclusive=True)
        done, _, _ = case.migrate("router")
    finally:
        conn.close()
    assert done.returncode == 2
    assert f"another `priority-router migrate {case.queue}` is running" in done.stderr
    assert case.kind() == "plain" and case.kind(case.queue + HOLDING_SUFFIX) == "missing"


def test_a_run_that_fails_while_publishers_are_held_lets_them_go(
    case: Case, real_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    backlog = case.backlog(router=False, count=20)
    app = create_app(case.env_of(True))

    def refused(self: Migration) -> None:
        raise RuntimeError("exchange refused")

    monkeypatch.setattr(Migration, "bind", refused)
    try:
        with pytest.raises(RuntimeError, match="exchange refused"):
            migrate(app, case.queue, Target.ROUTER)
        assert not real_redis.hlen(migrations_key(case.env["PRIORITY_ROUTER_KEY_PREFIX"]))
        monkeypatch.undo()
        report = migrate(app, case.queue, Target.ROUTER)
    finally:
        close_app(app)
    assert [s.action for s in report.steps][1:] == ["bound", "moved back", "deleted holding queue"]
    assert set(_ids(case.drain(20))) == set(backlog)


def test_the_bindings_of_the_apps_queue_definition_are_restored(case: Case, key_prefix: str) -> None:
    from celery import Celery
    from kombu import Exchange, Queue, binding

    from priority_router import PriorityRouter

    def app_with_queue(router: bool) -> Celery:
        app = Celery("bindings", broker=case.url, set_as_current=False)
        app.conf.task_queues = [
            Queue(
                case.queue,
                bindings=[
                    binding(Exchange(f"{case.queue}-topic", "topic"), routing_key="docs.#"),
                    binding(Exchange(f"{case.queue}-direct", "direct"), routing_key="alt"),
                ],
            )
        ]
        if router:
            PriorityRouter(case.env["PRIORITY_ROUTER_REDIS_URL"], key_prefix=key_prefix).install(app)
        return app

    plain, routed = app_with_queue(False), app_with_queue(True)
    try:
        with plain.connection_for_write() as conn:
            plain.amqp.queues[case.queue].bind(conn.default_channel).declare()
        report = migrate(routed, case.queue, Target.ROUTER)
    finally:
        close_app(plain)
        close_app(routed)
    bound = next(s.detail for s in report.steps if s.action == "bound")
    assert f"exchange '{case.queue}-topic' (topic) with key 'docs.#'" in bound
    assert f"exchange '{case.queue}-direct' (direct) with key 'alt'" in bound
    conn, channel = case.channel()
    try:
        channel.basic_publish(amqp.Message(b"1"), exchange=f"{case.queue}-topic", routing_key="docs.new")
        channel.basic_publish(amqp.Message(b"2"), exchange=f"{case.queue}-direct", routing_key="alt")
        for name in ("topic", "direct"):
            channel.exchange_delete(f"{case.queue}-{name}")
    finally:
        conn.close()
    assert sorted(m.body for m in case.drain(2)) == [b"1", b"2"]
    assert case.kind() == "priority"
