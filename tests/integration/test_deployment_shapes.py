"""The router in the shapes real projects have, with real workers (see ``shapes/``)."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner
from support.celery_versions import needs_queue_type_setting
from support.services import LoggedProcess, Worker, close_app, running_worker

from priority_router.integration.installation import installation_of
from priority_router.ops.cli import main
from priority_router.router import installed_router

Loader = Any
_APP_MODULES = (
    "djproj",
    "djproj.celery",
    "djproj.settings",
    "pubsite",
    "plainsite",
    "docworker",
    "plainworker",
)


@pytest.fixture
def load(worker_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Loader]:
    """Import a shape module afresh in this process, configured by ``worker_env``."""
    apps: list[Celery] = []

    def _load(module: str, **extra_env: str) -> Celery:
        for key, value in {**worker_env, **extra_env}.items():
            monkeypatch.setenv(key, value)
        # Fresh app modules; task modules stay imported, as shared tasks join every new app.
        for name in [m for m in sys.modules if m.startswith("shapes.") and m.endswith(_APP_MODULES)]:
            stale = getattr(sys.modules.pop(name), "app", None)
            if isinstance(stale, Celery) and stale not in apps:
                close_app(stale)  # loaded by a CLI run (-A), not by this fixture
            parent, _, child = name.rpartition(".")
            # ``-A shapes.x`` finds x as an attribute of the package before importing it.
            with contextlib.suppress(KeyError, AttributeError):
                delattr(sys.modules[parent], child)
        app: Celery = importlib.import_module(module).app
        apps.append(app)
        return app

    yield _load
    for app in apps:
        router = installed_router(app)
        if router is not None:
            router.uninstall(app)
        with contextlib.suppress(Exception), app.connection_for_write() as conn:
            conn.default_channel.queue_delete(worker_env["DOCUMENT_QUEUE"])
        close_app(app)


def _started_order(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(results, key=lambda r: r["started_at"])


@pytest.mark.compat
def test_django_style_project_with_install_before_configuration(
    load: Loader, worker_env: dict[str, str]
) -> None:
    app = load("shapes.djproj")
    from shapes.djproj.documents.tasks import process  # type: ignore[import-not-found]

    ids = [process.apply_async(("heavy", f"h{n}"), headers={"client_id": "heavy"}).id for n in range(30)]
    ids += [process.apply_async((f"light{c}", "l0"), headers={"client_id": f"light{c}"}).id for c in range(3)]
    with running_worker(worker_env, "--pool", "solo", app="shapes.djproj") as worker:
        done = [app.AsyncResult(i).get(timeout=120) for i in ids]
        log = worker.output()

    assert len(done) == 33
    assert {r["queue"] for r in done} == {worker_env["DOCUMENT_QUEUE"]}
    heavy = [r["priority"] for r in done if r["client_id"] == "heavy"]
    assert heavy[:22] == [1, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 8, 8, 8, 8, 9]
    first_six = {r["client_id"] for r in _started_order(done)[:6]}
    assert {"light0", "light1", "light2"} <= first_six, "light clients ran before the heavy backlog"
    assert "priority-router keeps your" not in log and "cannot route" not in log


def test_separate_publisher_and_worker_codebases(load: Loader, worker_env: dict[str, str]) -> None:
    app = load("shapes.pubsite")
    ids = [
        app.send_task("docs.process", ("heavy", f"h{n}"), headers={"client_id": "heavy"}).id
        for n in range(20)
    ]
    ids += [app.send_task("docs.process", ("light", "l0"), headers={"client_id": "light"}).id]
    with running_worker(worker_env, "--pool", "solo", app="shapes.docworker"):
        done = [app.AsyncResult(i).get(timeout=120) for i in ids]
    order = [r["client_id"] for r in _started_order(done)]
    assert order.index("light") < 4, order


def test_explicit_priority_reaches_the_broker_unchanged(load: Loader, worker_env: dict[str, str]) -> None:
    app = load("shapes.pubsite")
    for n in range(25):
        app.send_task("docs.process", ("heavy", f"h{n}", 0), headers={"client_id": "heavy"})
    new = app.send_task("docs.process", ("new", "d", 0), headers={"client_id": "new"}, priority=9)
    heavy = app.send_task("docs.process", ("heavy", "d", 0), headers={"client_id": "heavy"}, priority=0)
    anonymous = app.send_task("docs.process", ("", "d", 0), priority=7)
    with running_worker(worker_env, "--pool", "solo", app="shapes.docworker"):
        got = [r.get(timeout=120) for r in (new, heavy, anonymous)]
    assert [g["wire_priority"] for g in got] == [9, 0, 7]
    assert [g["reason"] for g in got] == ["explicit"] * 3
    assert installed_router(app).peek("heavy").pending == -25, "explicit documents are still counted"  # type: ignore[union-attr]


def test_expired_document_ends_revoked(load: Loader, worker_env: dict[str, str]) -> None:
    app = load("shapes.pubsite")
    result = app.send_task("docs.process", ("c", "d", 0), headers={"client_id": "c"}, expires=1)
    time.sleep(2.5)
    with running_worker(worker_env, "--pool", "solo", app="shapes.docworker"):
        deadline = time.monotonic() + 60
        while result.state != "REVOKED" and time.monotonic() < deadline:
            time.sleep(0.2)
    assert result.state == "REVOKED"


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_router_only_on_publishers_is_said_and_found(
    load: Loader, worker_env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    app = load("shapes.pubsite", PRIORITY_ROUTER_CONSUMER_CHECK_INTERVAL="1")
    queue = worker_env["DOCUMENT_QUEUE"]
    with (
        running_worker(worker_env, "--pool", "solo", app="shapes.plainworker"),
        caplog.at_level(logging.WARNING, "priority_router"),
    ):
        for n in range(12):  # priorities 1,1,1,2,2,3,3,4,4,5,5,6
            app.send_task("docs.process", ("heavy", f"h{n}", 0), headers={"client_id": "heavy"})
        deadline = time.monotonic() + 30
        while "without priority-router" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.2)
        warnings = [r.getMessage() for r in caplog.records if "without priority-router" in r.getMessage()]
        assert len(warnings) == 1, caplog.text
        assert repr(queue) in warnings[0] and "install the router in that worker's app" in warnings[0]
        time.sleep(1)  # the worker has taken the 3 documents it can see (priorities 3, 3, 6)

        runner = CliRunner()
        queues = runner.invoke(main, ["queues", "-A", "shapes.plainworker", "--json"])
        assert queues.exit_code == 0, queues.output
        depth = next(q for q in json.loads(queues.output)["queues"] if q["queue"] == queue)
        assert depth["ready"] == 9, depth

        worker_side = runner.invoke(main, ["doctor", "-A", "shapes.plainworker", "--json"])
        failed = {f["check"] for f in json.loads(worker_side.output) if not f["ok"]}
        assert worker_side.exit_code == 1 and {"router", "stranded", "workers"} <= failed
        publisher_side = runner.invoke(main, ["doctor", "-A", "shapes.pubsite", "--json"])
        findings = [f for f in json.loads(publisher_side.output) if not f["ok"]]
        assert publisher_side.exit_code == 1
        # The lists it leaves; blind to some priorities, and taking documents ahead (Celery's
        # defaults): both its own.
        assert [f["check"] for f in findings] == ["stranded", "workers", "workers"], findings
        assert all("install the router" in f["fix"] or "router installed" in f["fix"] for f in findings)


def _stranded_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "no worker takes from" in r.getMessage()]


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_a_publisher_only_install_names_the_lists_no_worker_takes_from_without_a_broadcast(
    load: Loader, worker_env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """The field trial's shape: the router on the publishing side only, a worker from an app
    without it, the publishers' broadcast off (the default).  20 of 33 documents wait in lists
    the worker never polls; the publisher says so within a minute, once, and doctor fails."""
    app = load("shapes.pubsite")  # worker_env: consumer_check_interval 0, as by default
    queue = worker_env["DOCUMENT_QUEUE"]
    with (
        running_worker(worker_env, "--pool", "solo", app="shapes.plainworker"),
        caplog.at_level(logging.INFO, "priority_router"),
    ):
        published = time.monotonic()
        ids = [
            app.send_task("docs.process", ("heavy", f"h{n}", 0), headers={"client_id": "heavy"}).id
            for n in range(30)
        ]
        ids += [
            app.send_task("docs.process", (f"light{c}", "l0", 0), headers={"client_id": f"light{c}"}).id
            for c in range(3)
        ]
        while not _stranded_warnings(caplog) and time.monotonic() - published < 60:
            time.sleep(0.5)
        (said,) = _stranded_warnings(caplog)
        assert sum(app.AsyncResult(i).ready() for i in ids) == 13  # priorities 3, 6 and 9 only
        assert f"20 document(s) of queue {queue!r}" in said, said
        for step, waiting in ((1, 6), (2, 2), (4, 2), (5, 2), (7, 2), (8, 6)):
            assert f"{queue + chr(6) + chr(22) + str(step)!r} ({waiting})" in said, said
        assert all(repr(queue + chr(6) + chr(22) + step) not in said for step in "369"), said
        assert "install the router in the app of the workers consuming that queue" in said
        assert "priority_steps'] = list(range(10))" in said

        doctor = CliRunner().invoke(main, ["doctor", "-A", "shapes.pubsite", "--json"])
        assert doctor.exit_code == 1, doctor.output
        (stranded,) = [f for f in json.loads(doctor.output) if f["check"] == "stranded"]
        assert not stranded["ok"], stranded
        assert repr(queue + "\x06\x161") + " (6 messages" in stranded["detail"], stranded
        assert "priority steps [0, 3, 6, 9] only" in stranded["detail"], stranded
        assert "install the router in the app of the workers" in stranded["fix"], stranded
    assert len(_stranded_warnings(caplog)) == 1, caplog.text


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_each_web_process_says_once_which_lists_no_worker_takes_from(worker_env: dict[str, str]) -> None:
    """Two web processes of a publisher-only codebase, each with its own log, and a worker
    without the router: each says it once, within a minute of its burst, and not again."""

    def web(client: str) -> LoggedProcess:
        env = {**worker_env, "WEB_CLIENT": client, "WEB_SECONDS": "45"}
        return LoggedProcess([sys.executable, "-m", "shapes.web_process"], env)

    def said(process: LoggedProcess) -> list[str]:
        return [line for line in process.output().splitlines() if "no worker takes from" in line]

    with running_worker(worker_env, "--pool", "solo", app="shapes.plainworker"):
        webs = [web("heavy-a"), web("heavy-b")]
        try:
            started = time.monotonic()
            while not all(said(w) for w in webs) and time.monotonic() - started < 60:
                time.sleep(0.5)
            for process in webs:
                assert process.process.wait(timeout=60) == 0, process.output()
                (warning,) = said(process)  # once, though it kept looking for 25 s more
                assert " WARNING " in warning and worker_env["DOCUMENT_QUEUE"] in warning
                assert "install the router in the app of the workers" in warning
        finally:
            for process in webs:
                process.stop()


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_a_draining_backlog_under_router_workers_is_never_called_stranded(
    load: Loader, worker_env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A backlog at every priority that a router worker drains over several of the
    publisher's looks, most urgent first: the less urgent lists wait, and are not stranded."""
    app = load("shapes.pubsite")
    with (
        running_worker(worker_env, "--pool", "solo", app="shapes.docworker"),
        caplog.at_level(logging.INFO, "priority_router"),
    ):
        ids = [
            app.send_task("docs.process", ("heavy", f"h{n}", 0.6), headers={"client_id": "heavy"}).id
            for n in range(60)
        ]
        ids += [
            app.send_task("docs.process", (f"light{c}", "l0", 0.6), headers={"client_id": f"light{c}"}).id
            for c in range(3)
        ]
        done = [app.AsyncResult(i).get(timeout=120) for i in ids]
        watch = installation_of(app).receiver.stranded_watch  # type: ignore[union-attr]
        assert watch is not None and watch.looks >= 2, "the publisher looked while the backlog drained"
        doctor = CliRunner().invoke(main, ["doctor", "-A", "shapes.pubsite", "--json"])
    assert len(done) == 63
    assert _stranded_warnings(caplog) == [], caplog.text
    (stranded,) = [f for f in json.loads(doctor.output) if f["check"] == "stranded"]
    assert stranded["ok"], stranded


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_router_only_on_workers_is_said_once(load: Loader, worker_env: dict[str, str]) -> None:
    app = load("shapes.plainsite")
    ids = [app.send_task("docs.process", (f"c{n}", "d", 0)).id for n in range(3)]
    with running_worker(worker_env, "--pool", "solo", app="shapes.docworker") as worker:
        for i in ids:
            app.AsyncResult(i).get(timeout=60)
        log = worker.output()
    assert log.count("without a priority-router decision") == 1, log
    assert "install the router in the publishing app" in log


@pytest.mark.rabbitmq
@pytest.mark.parametrize("broker_url", ["amqp"], indirect=True)
def test_rabbitmq_worker_without_router_fails_loudly_and_doctor_explains(
    load: Loader, worker_env: dict[str, str]
) -> None:
    app = load("shapes.pubsite")
    app.send_task("docs.process", ("c", "d", 0), headers={"client_id": "c"})  # declares the priority queue
    worker = Worker(worker_env, "--pool", "solo", app="shapes.plainworker")
    try:
        deadline = time.monotonic() + 60
        while "PRECONDITION_FAILED" not in worker.output() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "PRECONDITION_FAILED" in worker.output()
    finally:
        worker.stop()
    doctor = CliRunner().invoke(main, ["doctor", "-A", "shapes.plainworker", "--json"])
    assert doctor.exit_code == 1
    finding = next(f for f in json.loads(doctor.output) if f["check"] == "x-max-priority")
    assert "PRECONDITION_FAILED" in finding["detail"] and "install the router" in finding["fix"]


@pytest.mark.compat
@pytest.mark.rabbitmq
@needs_queue_type_setting
@pytest.mark.parametrize("broker_url", ["amqp"], indirect=True)
def test_quorum_default_queue_is_declared_and_served(load: Loader, worker_env: dict[str, str]) -> None:
    app = load("shapes.djproj", QUEUE_TYPE="quorum")
    from shapes.djproj.documents.tasks import process

    assert app.amqp.default_queue.queue_arguments == {"x-queue-type": "quorum"}
    results = [process.apply_async((f"c{n}", "d", 0), headers={"client_id": f"c{n}"}) for n in range(5)]
    with running_worker(
        {**worker_env, "QUEUE_TYPE": "quorum"}, "--pool", "solo", app="shapes.djproj"
    ) as worker:
        done = [r.get(timeout=60) for r in results]
        log = worker.output()
    assert len(done) == 5 and {d["reason"] for d in done} == {"counted"}
    # In the worker's log as Celery formats it (it was said before Celery set its log up).
    warning = next(line for line in log.splitlines() if "is a quorum queue" in line)
    assert "WARNING/MainProcess] priority-router: queue " in warning, log
    assert "before RabbitMQ 4.0" in warning or "RabbitMQ 4" in warning


def test_doctor_fails_when_the_counter_store_is_down(load: Loader) -> None:
    load("shapes.pubsite", PRIORITY_ROUTER_REDIS_URL="redis://127.0.0.1:1/0")
    doctor = CliRunner().invoke(main, ["doctor", "-A", "shapes.pubsite", "--json"])
    assert doctor.exit_code == 1
    finding = next(f for f in json.loads(doctor.output) if f["check"] == "counter store")
    assert not finding["ok"] and "does not answer" in finding["detail"]


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_a_router_worker_finds_a_blind_worker_on_its_queue_as_it_starts_and_never_a_router_one(
    worker_env: dict[str, str],
) -> None:
    """Publishers broadcast nothing by default: each router worker looks once as it starts."""

    def hostname(worker: Worker) -> str:
        args = list(worker.process.args)  # type: ignore[arg-type]
        return str(args[args.index("--hostname") + 1]).split("@")[0]

    def warnings(worker: Worker) -> list[str]:
        return [line for line in worker.output().splitlines() if "without priority-router" in line]

    with (
        running_worker(worker_env, "--pool", "solo", app="shapes.plainworker") as plain,
        running_worker(worker_env, "--pool", "threads", "-c", "2", app="shapes.docworker") as first,
        running_worker(worker_env, "--pool", "threads", "-c", "2", app="shapes.docworker") as second,
    ):
        deadline = time.monotonic() + 30
        while not (warnings(first) and warnings(second)) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
        for router_worker in (first, second):
            (said,) = warnings(router_worker)
            assert f"worker {hostname(plain)}@" in said, said
            assert worker_env["DOCUMENT_QUEUE"] in said and "install the router in that worker's app" in said
            assert hostname(first) not in said and hostname(second) not in said
