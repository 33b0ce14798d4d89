"""Real services for the tests and the benchmarks: RabbitMQ and its vhosts, and real
Celery worker and Flower processes with their logs."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from workers.local_redis import free_port, stop_process

ROOT = Path(__file__).resolve().parents[1]


def tcp_answers(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default_port), 1):
            return True
    except OSError:
        return False


def ensure_rabbitmq(url: str, timeout: float = 90) -> str | None:
    """None when RabbitMQ answers at ``url`` (starting it if the server is installed),
    else the reason it is missing."""
    if tcp_answers(url, 5672):
        return None
    server = shutil.which("rabbitmq-server")
    if server is None:
        return f"no RabbitMQ answers at {url} and no rabbitmq-server program is installed"
    subprocess.run([server, "-detached"], check=False, capture_output=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if tcp_answers(url, 5672):
            time.sleep(2)  # the port opens a moment before the broker accepts logins
            return None
        time.sleep(1)
    return f"rabbitmq-server was started but {url} did not answer within {timeout:.0f} s"


def _rabbitmqctl(*args: str) -> bool:
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        return False
    done = subprocess.run([ctl, *args], capture_output=True, text=True, timeout=60)
    return done.returncode == 0


@contextmanager
def temporary_vhost(amqp_url: str, name: str = "pr-test", user: str = "guest") -> Iterator[str]:
    """``amqp_url`` on a new vhost of its own (``name`` plus a random suffix; deleted
    afterwards, with all in it), made with ``rabbitmqctl``; ``amqp_url`` itself where that
    cannot be done."""
    name = f"{name}-{uuid.uuid4().hex[:8]}"
    if not _rabbitmqctl("add_vhost", name):
        yield amqp_url
        return
    try:
        _rabbitmqctl("set_permissions", "-p", name, user, ".*", ".*", ".*")
        parts = urlsplit(amqp_url)
        yield urlunsplit((parts.scheme, parts.netloc, "/" + quote(name, safe=""), "", ""))
    finally:
        _rabbitmqctl("delete_vhost", name)


def fast_redelivery(env: Mapping[str, str]) -> str:
    """Redis broker options for a test that kills workers: a dead worker's unacked documents
    come back after 3 s instead of an hour, swept every second instead of every ~100 s
    (RabbitMQ requeues them at once).

    The unacked hash, its index and the sweep's lock are the test's own (named after its
    queue), not kombu's ``unacked`` keys every test on the broker's database shares: with
    shared keys, these workers' 3 s sweep requeued other tests' long documents mid-run, and
    a default worker SIGKILLed while it held the shared lock stopped every sweep on the
    database for kombu's 300 s, so a test waiting 90 s for a redelivery failed."""
    own = env["DOCUMENT_QUEUE"]
    return json.dumps(
        {
            "visibility_timeout": 3,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
            "unacked_mutex_expire": 5,
            "unacked_key": f"{own}.unacked",
            "unacked_index_key": f"{own}.unacked_index",
            "unacked_mutex_key": f"{own}.unacked_mutex",
        }
    )


def worker_command(*args: str, app: str = "workers.app") -> list[str]:
    """``celery -A app worker`` with this interpreter, a unique node name and ``args``."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        app,
        "worker",
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
        "--hostname",
        f"w{free_port()}@%h",
        *args,
    ]


def worker_environment(env: Mapping[str, str]) -> dict[str, str]:
    """This process's environment plus ``env``, with the project and test tasks importable."""
    full_env = {**os.environ, **env}
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "tests" / "integration"), full_env.get("PYTHONPATH", "")]
    )
    return full_env


class LoggedProcess:
    """A real child process of the tests whose output goes to a temporary log file."""

    def __init__(self, command: list[str], env: Mapping[str, str]) -> None:
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as the process
            prefix="pr-proc-", suffix=".log", delete=False
        )
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=worker_environment(env), stdout=self.log, stderr=subprocess.STDOUT
        )

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def ready(self) -> bool:
        raise NotImplementedError

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready():
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"{self} exited with {self.process.returncode}:\n{self.output()}")
            time.sleep(0.1)
        raise RuntimeError(f"{self} not ready after {timeout} s:\n{self.output()}")

    def stop(self) -> None:
        stop_process(self.process, timeout=20)
        self.log.close()
        os.unlink(self.log.name)

    def __str__(self) -> str:
        return " ".join(str(a) for a in self.process.args[2:5])  # type: ignore[index]


class Worker(LoggedProcess):
    """A real ``celery -A <app> worker`` process (``workers.app`` by default)."""

    def __init__(self, env: Mapping[str, str], *args: str, app: str = "workers.app") -> None:
        super().__init__(worker_command(*args, app=app), env)

    def ready(self) -> bool:
        return " ready." in self.output()


class Flower(LoggedProcess):
    """A real Flower (``celery -A <app> flower``) with its API open, on a free port."""

    def __init__(self, env: Mapping[str, str], app: str = "workers.app") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "celery", "-A", app, "flower"]
        command += ["--address=127.0.0.1", f"--port={self.port}"]
        super().__init__(command, {**env, "FLOWER_UNAUTHENTICATED_API": "true"})

    def ready(self) -> bool:
        return tcp_answers(self.url, self.port)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            body = response.read().decode()
        return json.loads(body) if response.headers.get_content_type() == "application/json" else body


@contextmanager
def running_worker(env: Mapping[str, str], *args: str, app: str = "workers.app") -> Iterator[Worker]:
    worker = Worker(env, *args, app=app)
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.stop()
