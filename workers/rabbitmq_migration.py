"""What the RabbitMQ migration's tests and benchmark share: a vhost of their own, a live
publisher process, and counting every document that was sent and that ran."""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from workers.services import ROOT, LoggedProcess, worker_environment

#: A worker's line for each document it ran.
_SUCCEEDED = re.compile(r"Task workers\.hold_document\[([^\]]+)\] succeeded")


@dataclass(frozen=True)
class Sent:
    """One publish: the document, when the publish began (``time.monotonic()``, the same
    clock in every process) and how long it took."""

    task_id: str
    started: float
    seconds: float


class Publisher(LoggedProcess):
    """``migration_publisher.py``: publishes documents at ``rate`` per second until stopped."""

    def __init__(
        self, env: Mapping[str, str], workdir: Path, rate: float = 50.0, seconds: float = 0.0
    ) -> None:
        self.sent = workdir / f"sent-{uuid.uuid4().hex[:6]}.tsv"
        self.stop_file = workdir / f"stop-{uuid.uuid4().hex[:6]}"
        self.sent.touch()
        script = ROOT / "workers" / "migration_publisher.py"
        command = [sys.executable, str(script), str(self.sent), str(self.stop_file), f"--rate={rate}"]
        super().__init__([*command, f"--seconds={seconds}"], env)

    def ready(self) -> bool:
        return bool(self.sent.read_text())

    def finish(self, timeout: float = 30) -> None:
        """Stop publishing and wait for the process to end (``stop()`` still cleans up)."""
        self.stop_file.touch()
        self.process.wait(timeout)

    def publishes(self) -> list[Sent]:
        """Each document sent, in order."""
        rows = [line.split("\t") for line in self.sent.read_text().splitlines() if line]
        return [Sent(task_id, float(start), float(seconds)) for task_id, start, seconds in rows]

    def sent_ids(self) -> list[str]:
        return [s.task_id for s in self.publishes()]

    def __str__(self) -> str:
        return "migration publisher"


def ran(*outputs: str) -> collections.Counter[str]:
    """How many times each document ran, from the logs of every worker that ran any."""
    return collections.Counter(m.group(1) for text in outputs for m in _SUCCEEDED.finditer(text))


def publish_backlog(app: Any, count: int, tag: str, seconds: float = 0.0) -> list[str]:
    """``count`` documents sent by ``app`` to its default queue; their ids."""
    ids = [f"{tag}-backlog-{n}" for n in range(count)]
    for task_id in ids:
        app.send_task(
            "workers.hold_document",
            ("backlog", task_id, seconds),
            task_id=task_id,
            headers={"client_id": "backlog"},
        )
    return ids


def migrate_command(queue: str, target: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "priority_router",
        "migrate",
        queue,
        "--to",
        target,
        "-A",
        "workers.app",
        *extra,
    ]


def run_migrate(env: Mapping[str, str], queue: str, target: str, *extra: str, timeout: float = 240) -> Any:
    """``priority-router migrate`` as the operator runs it; the process, its report (with
    ``--json``) and how long it took."""
    started = time.monotonic()
    done = subprocess.run(
        migrate_command(queue, target, *extra),
        cwd=ROOT,
        env=worker_environment(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    report = None
    if "--json" in extra and done.returncode == 0:
        report = json.loads(done.stdout)
    return done, report, time.monotonic() - started


def queue_contents(amqp_url: str, queue: str) -> list[Any]:
    """Every message waiting in ``queue``, read and removed (basic.get with no ack), its
    body as the bytes that were sent."""
    import amqp

    parts = urlsplit(amqp_url)
    vhost = parts.path[1:] or "/"
    conn = amqp.Connection(
        f"{parts.hostname}:{parts.port or 5672}",
        userid=parts.username or "guest",
        password=parts.password or "guest",
        virtual_host=vhost,
    )
    conn.connect()
    try:
        channel = conn.channel()
        channel.auto_decode = False
        messages = []
        while (message := channel.basic_get(queue=queue, no_ack=True)) is not None:
            messages.append(message)
        return messages
    finally:
        conn.close()
