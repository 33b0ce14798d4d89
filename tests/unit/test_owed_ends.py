"""Ends a worker could not send while the store failed are sent again (store/owed.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import fakeredis
import pytest
import redis

from priority_router import PriorityRouter
from priority_router.router import engine_of
from priority_router.store.owed import OwedEnds


class Stalls:
    """Wraps a router's in-flight store so that its ends fail while ``stalled``."""

    def __init__(self, router: PriorityRouter) -> None:
        assert engine_of(router).inflight is not None
        self.stalled = False
        self._end = engine_of(router).inflight.end
        engine_of(router).inflight.end = self.end  # type: ignore[method-assign]

    def end(self, *args: object) -> bool:
        if self.stalled:
            raise redis.TimeoutError("Timeout reading from socket")
        return self._end(*args)  # type: ignore[arg-type]


def _router(cooldown: float = 0.05) -> PriorityRouter:
    return PriorityRouter(mode="inflight", cooldown=cooldown, redis_client=fakeredis.FakeRedis())


def _in_flight(router: PriorityRouter, client: str) -> int:
    # The next document would be checked at 1 - (documents in flight); no key: none.
    return 1 - router.peek(client).pending if router.state(client).ttl_ms is not None else 0


def test_ends_missed_during_a_stall_are_sent_once_the_store_answers(caplog: pytest.LogCaptureFixture) -> None:
    router = _router()
    for n in range(5):
        router.record("heavy", f"t{n}")
    stalls = Stalls(router)
    stalls.stalled = True
    assert [engine_of(router).end_quietly("heavy", f"t{n}") for n in range(3)] == [False] * 3
    assert "keeping documents' ends to send later" in caplog.text
    stalls.stalled = False
    assert _in_flight(router, "heavy") == 5  # nothing ended yet
    time.sleep(0.1)  # past the cooldown: the next end sends the owed ones too
    assert engine_of(router).end_quietly("heavy", "t3") is True
    assert _in_flight(router, "heavy") == 1


def test_owed_ends_go_without_any_further_end() -> None:
    """An idle worker: its retrier thread sends them once the store answers."""
    router = _router()
    router.record("heavy", "t0")
    stalls = Stalls(router)
    stalls.stalled = True
    assert engine_of(router).end_quietly("heavy", "t0") is False
    stalls.stalled = False
    deadline = time.monotonic() + 5
    while _in_flight(router, "heavy") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _in_flight(router, "heavy") == 0


def test_an_end_sent_again_after_a_lost_reply_ends_nothing_more() -> None:
    """The store applied the end but its reply was lost: sending it again is harmless."""
    router = _router()
    for n in range(3):
        router.record("heavy", f"t{n}")
    assert engine_of(router).end_quietly("heavy", "t0") is True
    engine_of(router)._owed.add(("heavy", "t0", 1000))  # as if its reply had timed out
    assert engine_of(router).retry_ends_quietly() == 1
    assert _in_flight(router, "heavy") == 2


def test_a_failed_retry_keeps_every_end_it_did_not_send() -> None:
    router = _router()
    for n in range(4):
        router.record("heavy", f"t{n}")
    stalls = Stalls(router)
    stalls.stalled = True
    for n in range(4):
        engine_of(router).end_quietly("heavy", f"t{n}")
    time.sleep(0.1)
    assert engine_of(router).retry_ends_quietly() == 0  # still failing: all kept
    # (the owed-ends thread may be holding them for its own attempt at this moment)
    deadline = time.monotonic() + 5
    while len(engine_of(router)._owed) != 4 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(engine_of(router)._owed) == 4
    stalls.stalled = False
    deadline = time.monotonic() + 5
    while _in_flight(router, "heavy") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _in_flight(router, "heavy") == 0 and len(engine_of(router)._owed) == 0


def test_the_queue_is_bounded_and_forgets_the_oldest() -> None:
    owed = OwedEnds(limit=2)
    assert owed.add(("a", "1", 1)) and owed.add(("a", "2", 1))
    assert owed.add(("a", "3", 1)) is False
    assert owed.take(5) == [("a", "2", 1), ("a", "3", 1)]
    owed.give_back([("a", "4", 1), ("a", "5", 1), ("a", "6", 1)])
    assert owed.take(5) == [("a", "4", 1), ("a", "5", 1)]


def test_a_forked_child_starts_a_retrier_of_its_own() -> None:
    # The parent's retrier is busy at the fork: the child (a prefork pool process) must send
    # what it owes with a thread of its own.  Forked in a process of its own, not in the
    # threaded test process.
    script = """
import os, threading, time, warnings
warnings.simplefilter("ignore", DeprecationWarning)
from priority_router.store.owed import OwedEnds
owed = OwedEnds()
busy = threading.Event()
owed.add("x")
owed.retry_every(0.01, busy.wait)
time.sleep(0.05)
pid = os.fork()
if pid == 0:
    sent = []
    owed.add("y")
    owed.retry_every(0.01, lambda: sent.extend(owed.take(10)))
    deadline = time.monotonic() + 5
    while not sent and time.monotonic() < deadline:
        time.sleep(0.01)
    os._exit(0 if sent else 1)
_, status = os.waitpid(pid, 0)
busy.set()
print(os.waitstatus_to_exitcode(status))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


def test_ends_given_back_after_the_retrier_stopped_are_retried() -> None:
    """The retrier stops when it finds nothing owed, which it may while another thread has
    the ends out for an attempt of its own: those given back start it again."""
    owed: OwedEnds[str] = OwedEnds()
    sent: list[str] = []
    owed.add("x")
    owed.retry_every(0.01, lambda: sent.extend(owed.take(10)))
    deadline = time.monotonic() + 5
    while not sent and time.monotonic() < deadline:
        time.sleep(0.01)
    taken = ["y"]  # another thread's attempt, out while the retrier found nothing owed
    time.sleep(0.05)  # the retrier has stopped
    owed.give_back(taken)
    deadline = time.monotonic() + 5
    while "y" not in sent and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sent == ["x", "y"]
