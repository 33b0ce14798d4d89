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


def _doctor(name: str) -> list[dict[str, Any]]:
    result = CliRunner().invoke(main, ["doctor", "-A", name, "--json"])
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


def test_a_kept_setting_is_warned_in_the_workers_logfile(
    app_module: AppFactory, redis_server_url: str, tmp_path: Path
) -> None:
    """``celery worker`` reads the app's configuration for its options' defaults before it
    sets its log up: the router's warning about a kept setting went to a bare stderr then,
    not to ``--logfile`` (with ``--detach`` or systemd, the only log anyone reads)."""
    name = app_module(
        broker_db_url(redis_server_url), f"q-{uuid.uuid4().hex[:8]}", {"worker_prefetch_multiplier": 4}
    )
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
    assert "keeps your" not in console.read_text(), console.read_text()
