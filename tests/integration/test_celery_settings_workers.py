"""Celery's own worker settings beside the router's, with real workers: where the router's
warnings go (``--logfile``), ``worker_disable_prefetch`` (Celery 5.6, Redis only) and eta
and countdown tasks with and without ``worker_eta_task_limit`` (Celery 5.6)."""

from __future__ import annotations

import importlib
import json
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.app.defaults import DEFAULTS
from click.testing import CliRunner
from support.services import (
    ROOT,
    broker_db_url,
    running_worker,
    stop_process,
    worker_command,
    worker_environment,
)

from priority_router.ops.cli import main

AppFactory = Callable[..., str]

needs_disable_prefetch = pytest.mark.skipif(
    "worker_disable_prefetch" not in DEFAULTS, reason="Celery before 5.6 has no worker_disable_prefetch"
)
needs_eta_task_limit = pytest.mark.skipif(
    "worker_eta_task_limit" not in DEFAULTS, reason="Celery before 5.6 has no worker_eta_task_limit"
)


def _app(name: str) -> Celery:
    return importlib.import_module(name).app  # type: ignore[no-any-return]


def _doctor(name: str, *args: str) -> list[dict[str, Any]]:
    result = CliRunner().invoke(main, ["doctor", "-A", name, *args, "--json"])
    try:
        findings: list[dict[str, Any]] = json.loads(result.output)
    except json.JSONDecodeError:
        raise AssertionError(result.output) from None
    return findings


def _alone(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with a control exchange of the test's own: other sessions' workers on
    the broker do not answer doctor's broadcasts."""
    return {**settings, "control_exchange": f"alone-{uuid.uuid4().hex[:8]}"}


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_the_routers_warnings_at_start_are_in_the_workers_logfile(
    app_module: AppFactory, redis_server_url: str, tmp_path: Path
) -> None:
    """``celery worker`` reads the app's configuration for its options' defaults before it
    sets its log up: the router's warnings about a kept setting and a misspelt one went to
    a bare stderr then, not to ``--logfile`` (with ``--detach`` or systemd, the only log
    anyone reads)."""
    settings = {"worker_prefetch_multiplier": 4, "priority_router_mdoe": "inflight"}
    name = app_module(broker_db_url(redis_server_url), f"q-{uuid.uuid4().hex[:8]}", settings)
    log = tmp_path / "worker.log"
    env = worker_environment({"PYTHONPATH": str(tmp_path)})
    command = worker_command("--pool", "solo", "--logfile", str(log), app=name)
    console = tmp_path / "console.txt"
    with console.open("w") as out:
        worker = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_for(lambda: log.exists() and " ready." in log.read_text(), "the worker is not ready")
        finally:
            stop_process(worker, timeout=20)
    said = log.read_text()
    warning = next(line for line in said.splitlines() if "keeps your worker_prefetch_multiplier=4" in line)
    assert "WARNING/MainProcess] priority-router keeps your" in warning, said
    assert said.count("keeps your") == 1, said
    assert "WARNING/MainProcess] priority-router ignores priority_router_mdoe" in said, said
    assert "priority-router" not in console.read_text(), console.read_text()


@needs_disable_prefetch
def test_disable_prefetch_neutralises_the_multiplier(
    app_module: AppFactory, redis_server_url: str, tmp_path: Path
) -> None:
    """With Celery's ``worker_disable_prefetch`` on Redis, a worker at the user's multiplier
    of 4 takes no document beyond the ones its pool runs: neither its log nor doctor may
    say it reserves documents ahead."""
    settings = {"worker_prefetch_multiplier": 4, "worker_disable_prefetch": True, "imports": ["worker_tasks"]}
    name = app_module(broker_db_url(redis_server_url), f"q-{uuid.uuid4().hex[:8]}", _alone(settings))
    app = _app(name)
    env = {"PYTHONPATH": str(tmp_path)}
    with running_worker(env, "--pool", "threads", "--concurrency", "2", app=name) as worker:
        for n in range(8):
            app.send_task("tests.hold_and_record", (5.0,), headers={"client_id": f"c{n}"})
        _wait_for(lambda: worker.output().count(" received") >= 2, "the worker took no document")
        time.sleep(1.0)  # a worker reserving ahead takes all 8 (2 slots x 4) by now
        received = worker.output().count(" received")
        findings = _doctor(name)
        log = worker.output()
    assert received == 2, log
    assert "keeps your" not in log, log
    assert "worker_prefetch_multiplier=4, task_acks_late=True, worker_disable_prefetch=True" in log
    failed = {f["check"]: f["detail"] for f in findings if not f["ok"]}
    assert not {"prefetch", "workers"} & set(failed), failed
    (prefetch,) = [f for f in findings if f["check"] == "prefetch"]
    assert "worker_prefetch_multiplier=4, worker_disable_prefetch=True" in prefetch["detail"]


@needs_disable_prefetch
def test_disable_prefetch_on_a_gevent_worker_with_redis_is_warned_and_failed(
    app_module: AppFactory, redis_server_url: str, tmp_path: Path
) -> None:
    """There it stalls the worker each time its pool fills (0.05-0.30x plain Celery's rate,
    docs/brokers.md), the stall the router's multiplier of 0 avoids: said in the worker's
    log as it starts, and failed by doctor, both naming the setting and the way out."""
    settings = {"worker_disable_prefetch": True}
    name = app_module(broker_db_url(redis_server_url), f"q-{uuid.uuid4().hex[:8]}", _alone(settings))
    env = {"PYTHONPATH": str(tmp_path)}
    with running_worker(env, "--pool", "gevent", "--concurrency", "20", app=name) as worker:
        log = worker.output()
    warning = next(line for line in log.splitlines() if "keeps your worker_disable_prefetch=True" in line)
    assert "WARNING" in warning and "stalls for up to 2 s each time its pool fills" in warning, log
    findings = _doctor(name, "-P", "gevent", "-c", "20")
    (failed,) = [f for f in findings if f["check"] == "prefetch" and not f["ok"]]
    assert "worker_disable_prefetch=True" in failed["detail"], failed
    assert "set worker_disable_prefetch = False" in failed["fix"], failed


@pytest.mark.parametrize(
    "limit", [None, pytest.param(3, marks=needs_eta_task_limit)], ids=["unlimited", "limit"]
)
def test_doctor_names_eta_tasks_held_by_the_workers(
    app_module: AppFactory, redis_server_url: str, tmp_path: Path, limit: int | None
) -> None:
    """Countdown tasks a worker holds until they come due fill the prefetch window that
    ``worker_eta_task_limit`` caps: with 3 held at a limit of 3 the worker takes no
    document (a light client's waits until they come due), and doctor fails it, naming
    the worker and the way out.  Without the limit the window widens by one for each."""
    settings: dict[str, Any] = {"imports": ["worker_tasks"]}
    if limit is not None:
        settings["worker_eta_task_limit"] = limit
    name = app_module(broker_db_url(redis_server_url), f"q-{uuid.uuid4().hex[:8]}", _alone(settings))
    app = _app(name)
    env = {"PYTHONPATH": str(tmp_path)}
    with running_worker(env, "--pool", "threads", "--concurrency", "2", app=name) as worker:
        for _ in range(3):
            app.send_task("tests.hold_and_record", (0.0,), headers={"client_id": "later"}, countdown=300)
        _wait_for(lambda: worker.output().count(" received") >= 3, "the countdown tasks were not received")
        light = app.send_task(
            "tests.record_request", kwargs={"client_id": "light"}, headers={"client_id": "light"}
        )
        done = f"Task tests.record_request[{light.id}] succeeded"
        if limit is None:
            _wait_for(lambda: done in worker.output(), "the light document did not run")
        else:
            time.sleep(2.0)  # a worker with a free slot runs it within milliseconds
        ran = done in worker.output()
        findings = _doctor(name)
        log = worker.output()
    (eta,) = [f for f in findings if f["check"] == "eta tasks"]
    if limit is None:
        assert ran, log
        assert eta["ok"], eta
        assert "eta and countdown tasks: 3 held now by the 1 worker(s) answering" in eta["detail"], eta
        return
    assert not ran, log
    assert not eta["ok"], eta
    assert "holds 3 eta/countdown task(s), as many as its worker_eta_task_limit=3" in eta["detail"], eta
    assert "takes no document until one comes due" in eta["detail"]
    assert "queue of their own" in eta["fix"]
