"""One worker partitioned from the counter store for 10 s (docs/caps.md): a test host in a
network namespace of the test's own, its link to the store cut with a firewall rule.

The worker keeps running documents meanwhile (without their limits: the store cannot
answer) and keeps the ends it could not send; once the link is back it sends them, so the
capped client's slots come back within about a second, not when their leases run out, and
every document runs once."""

from __future__ import annotations

import itertools
import os
import random
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from support.services import IN_CI, LoggedProcess, Worker, running_worker, worker_command

from priority_router import PriorityRouter
from priority_router.demo.local_redis import EmbeddedRedis, start_embedded_redis
from workers.app import create_app

TRACK = "tests.track_running"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class Host:
    """A network namespace joined to this host by a veth pair, on a /30 of its own."""

    def __init__(self) -> None:
        suffix = uuid.uuid4().hex[:6]
        self.name = f"pr-{suffix}"
        self.link = f"prh{suffix}"
        net = random.randrange(0, 250)
        self.host_ip, self.ip = f"10.231.{net}.1", f"10.231.{net}.2"
        _ip("netns", "add", self.name)
        _ip("link", "add", self.link, "type", "veth", "peer", "name", f"prn{suffix}")
        _ip("link", "set", f"prn{suffix}", "netns", self.name)
        _ip("addr", "add", f"{self.host_ip}/30", "dev", self.link)
        _ip("link", "set", self.link, "up")
        _ip("netns", "exec", self.name, "ip", "addr", "add", f"{self.ip}/30", "dev", f"prn{suffix}")
        _ip("netns", "exec", self.name, "ip", "link", "set", f"prn{suffix}", "up")
        _ip("netns", "exec", self.name, "ip", "link", "set", "lo", "up")

    def cut(self, port: int) -> None:
        """Drop this host's packets to ``port`` on the host (a partition from that server)."""
        rule = ["-p", "tcp", "-d", self.host_ip, "--dport", str(port), "-j", "DROP"]
        _ip("netns", "exec", self.name, "iptables", "-A", "OUTPUT", *rule)

    def mend(self, port: int) -> None:
        rule = ["-p", "tcp", "-d", self.host_ip, "--dport", str(port), "-j", "DROP"]
        _ip("netns", "exec", self.name, "iptables", "-D", "OUTPUT", *rule)

    def remove(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", self.link], capture_output=True, timeout=10)


class HostedWorker(Worker):
    """A worker process inside ``host``'s namespace."""

    def __init__(self, host: Host, env: dict[str, str], *args: str) -> None:
        LoggedProcess.__init__(self, ["ip", "netns", "exec", host.name, *worker_command(*args)], env)


def _partition_needs() -> str | None:
    """What this machine lacks to cut a worker off the store, or None."""
    lacking = [name for name in ("ip", "iptables") if shutil.which(name) is None]
    if lacking:
        return f"{' and '.join(lacking)} (Debian: iproute2, iptables)"
    if os.geteuid() != 0:
        return "root, to make a network namespace (ip netns add)"
    return None


@pytest.fixture
def host() -> Iterator[Host]:
    missing = _partition_needs()
    if missing is not None:
        # CI installs what this needs (.ci/run); on a developer's machine it is optional.
        (pytest.fail if IN_CI else pytest.skip)(f"the partition test needs {missing}")
    made = Host()
    try:
        yield made
    finally:
        made.remove()


def _server(host: Host) -> Iterator[EmbeddedRedis]:
    server = start_embedded_redis(extra=["--bind", "127.0.0.1", host.host_ip, "--protected-mode", "no"])
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def store(host: Host) -> Iterator[EmbeddedRedis]:
    yield from _server(host)


@pytest.fixture
def broker(host: Host) -> Iterator[EmbeddedRedis]:
    yield from _server(host)


def _wait(condition: Callable[[], bool], what: str, timeout: float, log: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: {log()[-3000:]}"
        time.sleep(0.05)


def test_a_worker_partitioned_from_the_store_for_10_s_stalls_nobody_once_it_is_back(
    host: Host, store: EmbeddedRedis, broker: EmbeddedRedis
) -> None:
    at = host.host_ip
    key = f"runs-{uuid.uuid4().hex[:8]}"
    env = {
        "BROKER_URL": f"redis://{at}:{broker.port}/0",
        "RESULT_BACKEND": f"redis://{at}:{broker.port}/1",
        "RUNS_REDIS_URL": f"redis://{at}:{broker.port}/2",
        "RUNS_KEY": key,
        "DOCUMENT_QUEUE": f"documents-{uuid.uuid4().hex[:8]}",
        "PRIORITY_ROUTER_REDIS_URL": f"redis://{at}:{store.port}/0",
        "PRIORITY_ROUTER_KEY_PREFIX": "partition:",
        "WORKER_INCLUDE": "worker_tasks",
    }
    router = PriorityRouter.from_env(env, socket_timeout=5, connect_timeout=5)
    router.set_tier("bulk", max_in_flight=2)
    app: Celery = create_app(env)
    # 120: at its cap of 2 the client runs 4 a second on the other worker, and the cut-off
    # worker, failing open, 2 more: at most 60 in the 10 s partition, so some are still
    # waiting when the link is back whatever the machine's speed (with 60, a run whose
    # cut-off worker did not stall on the lost link finished them all during it).
    docs: list[Any] = [app.send_task(TRACK, kwargs={"seconds": 0.5, "client_id": "bulk"}) for _ in range(120)]
    runs = redis.Redis.from_url(env["RUNS_REDIS_URL"])
    cut_off = HostedWorker(host, env, "-P", "threads", "-c", "1")
    try:
        cut_off.wait_ready()
        with running_worker(env, "-P", "threads", "-c", "2") as other:
            _wait(lambda: len(runs.hkeys(key)) >= 6, "nothing ran", 60, other.output)
            host.cut(store.port)
            time.sleep(10)
            host.mend(store.port)
            mended = time.time()
            done = [doc.get(timeout=120) for doc in docs]
        out = cut_off.output()
    finally:
        cut_off.stop()
        app.close()
    ran = [int(runs.hget(key, f"run:{doc.id}") or 0) for doc in docs]
    runs.delete(key)
    assert ran == [1] * len(docs)
    assert "the gate's counter store" in out, out[-3000:]  # it saw the partition
    # Once the link was back, the client's documents started at once: its slots were not
    # kept by ends the partitioned worker could not send (leases: 30 s).
    after = sorted(r["started"] for r in done if r["started"] > mended)
    assert after, "every document ran during the partition: the test shows nothing"
    assert after[0] - mended < 3, f"the capped client waited {after[0] - mended:.1f} s after the partition"
    assert max(b - a for a, b in itertools.pairwise(after)) < 3
