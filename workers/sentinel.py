"""A throwaway Redis Sentinel setup for the tests: a master, its replica and three Sentinels
(quorum 2), each a process of the test's own on a free port, in a temporary directory."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from workers.local_redis import EmbeddedRedis, free_port, start_embedded_redis, stop_process

#: The service name the Sentinels monitor.
SERVICE = "documents"
#: Milliseconds without an answer before a Sentinel calls the master down: small, so a
#: failover takes a couple of seconds, yet above a busy test machine's hiccups.
DOWN_AFTER_MS = 1000


@dataclass
class LocalSentinel:
    master: EmbeddedRedis
    replica: EmbeddedRedis
    sentinel_ports: list[int]

    def url(self, db: int = 0) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/{db}"

    def master_port(self) -> int:
        """The master's port as the first Sentinel that answers reports it."""
        for port in self.sentinel_ports:
            try:
                with redis.Redis(port=port, socket_timeout=1) as sentinel:
                    _, master_port = sentinel.sentinel_get_master_addr_by_name(SERVICE)
                    return int(master_port)
            except redis.RedisError:
                continue
        raise RuntimeError("no Sentinel answers")

    def is_master(self, server: EmbeddedRedis) -> bool:
        try:
            with redis.Redis(port=server.port, socket_timeout=0.5) as direct:
                return bool(direct.execute_command("ROLE")[0] == b"master")
        except redis.RedisError:
            return False


def _start_sentinel(executable: str, workdir: Path, master_port: int) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    conf = workdir / f"sentinel-{port}.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {workdir}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 2\n"
        f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
        f"sentinel failover-timeout {SERVICE} 10000\n"
    )
    process = subprocess.Popen(
        [executable, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return process, port


@contextmanager
def running_sentinel(executable: str, timeout: float = 30) -> Iterator[LocalSentinel]:
    """A master with one replica, watched by three Sentinels that see both; all stopped at the end."""
    workdir = Path(tempfile.mkdtemp(prefix="pr-sentinel-"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, True)
        master = start_embedded_redis(executable=executable)
        stack.callback(master.stop)
        replica = start_embedded_redis(
            executable=executable, extra=["--replicaof", "127.0.0.1", str(master.port)]
        )
        stack.callback(replica.stop)
        ports = []
        for _ in range(3):
            process, port = _start_sentinel(executable, workdir, master.port)
            stack.callback(stop_process, process, 10)
            ports.append(port)
        setup = LocalSentinel(master, replica, ports)
        deadline = time.monotonic() + timeout
        while not _ready(setup):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Sentinels did not see the master and its replica within {timeout} s")
            time.sleep(0.1)
        yield setup


def _ready(setup: LocalSentinel) -> bool:
    """Every Sentinel knows the replica and the other Sentinels (else a failover cannot start)."""
    for port in setup.sentinel_ports:
        try:
            with redis.Redis(port=port, socket_timeout=1) as sentinel:
                state = sentinel.sentinel_master(SERVICE)
        except redis.RedisError:
            return False
        if int(state.get("num-slaves", 0)) < 1 or int(state.get("num-other-sentinels", 0)) < 2:
            return False
    with redis.Redis(port=setup.replica.port, socket_timeout=1) as replica:
        return bool(replica.info("replication").get("master_link_status") == "up")
