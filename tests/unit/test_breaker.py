"""The counter store's circuit breaker: a failed store costs callers nothing, a background
probe finds it answering again within ``cooldown``, and each purpose says what it does
meanwhile once per outage."""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
import warnings

import pytest
import redis

from priority_router import PriorityRouter
from priority_router.router import engine_of
from priority_router.store.breaker import FIRST_PROBE, CircuitBreaker


class Store:
    """A probe target that fails until told to answer, noting when it was asked."""

    def __init__(self) -> None:
        self.up = False
        self.asked: list[float] = []
        self.answered = threading.Event()

    def ping(self) -> bool:
        self.asked.append(time.monotonic())
        if not self.up:
            raise redis.ConnectionError("refused")
        self.answered.set()
        return True


def wait_for(condition: object, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_an_open_breaker_refuses_at_once_and_a_probe_lets_the_next_call_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = Store()
    breaker = CircuitBreaker(0.2, "the store", probe=store.ping)
    caplog.set_level(logging.INFO, "priority_router")
    assert breaker.allow("publish")
    breaker.failure(redis.TimeoutError("Timeout reading from socket"), "publish")
    started = time.perf_counter()
    refused = [breaker.allow("publish") for _ in range(1000)]
    assert not any(refused)
    # No caller waits on the store, nor probes it: the breaker's own thread does.
    assert time.perf_counter() - started < 0.5
    wait_for(lambda: len(store.asked) >= 2)
    assert not breaker.allow("publish")
    store.up = True
    assert store.answered.wait(5)
    assert breaker.allow("publish")  # the call that confirms it
    assert not breaker.allow("publish")  # one at a time until it reports
    breaker.success()
    assert breaker.allow("publish") and not breaker.is_open
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in said] == ["WARNING", "INFO"]
    assert "own counts" in said[0][1] and "at most every 0.2 s" in said[0][1]
    assert "answering again" in said[1][1] and "publishes are counted again" in said[1][1]


def test_probes_start_quickly_and_back_off_to_the_cooldown() -> None:
    store = Store()
    breaker = CircuitBreaker(0.2, "the store", probe=store.ping)
    failed_at = time.monotonic()
    breaker.failure(redis.ConnectionError("refused"), "publish")
    wait_for(lambda: len(store.asked) >= 6)
    gaps = [b - a for a, b in zip([failed_at, *store.asked], store.asked, strict=False)]
    expected = [FIRST_PROBE, 0.1, 0.2, 0.2, 0.2, 0.2]
    # A sleep is never shorter than asked; so a dead store is asked at most this often.
    assert all(gap >= want - 0.005 for gap, want in zip(gaps, expected, strict=False)), gaps
    breaker.success()
    asked = len(store.asked)
    time.sleep(0.5)
    assert len(store.asked) <= asked + 1  # the prober stops once the store answers


def test_a_failed_confirming_call_reopens_without_a_second_warning(caplog: pytest.LogCaptureFixture) -> None:
    store = Store()
    store.up = True  # answers a PING, fails the call (a demoted master's READONLY)
    breaker = CircuitBreaker(0.2, "the store", probe=store.ping)
    caplog.set_level(logging.INFO, "priority_router")
    breaker.failure(redis.ConnectionError("refused"), "publish")
    assert store.answered.wait(5)
    assert breaker.allow("publish")
    store.answered.clear()
    breaker.failure(redis.ReadOnlyError("READONLY"), "publish")
    assert not breaker.allow("publish")
    assert store.answered.wait(5)
    assert breaker.allow("publish")
    breaker.success()
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]


def test_each_purpose_says_once_per_outage_what_it_does_meanwhile(caplog: pytest.LogCaptureFixture) -> None:
    store = Store()
    breaker = CircuitBreaker(5, "the store", probe=store.ping)
    caplog.set_level(logging.INFO, "priority_router")
    breaker.failure(redis.ConnectionError("refused"), "ends")
    for _ in range(3):
        assert not breaker.allow("ends")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1
    assert "keeping documents' ends" in messages[0] and "refused" in messages[0]
    assert "publish" not in messages[0]
    # The same process publishes too (a task that sends children): said once, when it does.
    for _ in range(3):
        assert not breaker.allow("publish")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and "own counts" in messages[1]
    breaker.success()
    assert "publishes are counted again, documents' ends are sent again" in caplog.records[-1].getMessage()
    # A new outage is said again.
    breaker.failure(redis.ConnectionError("refused"), "ends")
    assert caplog.records[-1].levelname == "WARNING"
    assert len(caplog.records) == 4


def test_without_a_probe_one_call_goes_through_every_cooldown(caplog: pytest.LogCaptureFixture) -> None:
    """The worker gate's own breaker: it says its own meanwhile and probes with a call."""
    now = [100.0]
    breaker = CircuitBreaker(2, "the gate's store", clock=lambda: now[0], meanwhile="documents run unlimited")
    caplog.set_level(logging.INFO, "priority_router")
    breaker.failure(redis.ConnectionError("refused"))
    assert not breaker.allow()
    now[0] += 2
    assert breaker.allow() and not breaker.allow()
    breaker.failure(redis.ConnectionError("refused"))
    now[0] += 2
    assert breaker.allow()
    breaker.success()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2
    assert "documents run unlimited until it answers (asking it again at most every 2.0 s)" in said[0]
    assert "answering again after 4.0 s" in said[1]


def test_a_bug_in_the_probe_is_said_with_its_traceback_and_calls_probe_instead(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken() -> None:
        raise TypeError("a bug")

    breaker = CircuitBreaker(0.1, "the store", probe=broken)
    breaker.failure(redis.ConnectionError("refused"), "publish")
    wait_for(lambda: any(r.exc_info for r in caplog.records))
    assert "probing the store failed unexpectedly" in caplog.text
    wait_for(lambda: breaker.allow("publish"))  # within the cooldown: a call probes


def _child_sees_the_store_again(breaker: CircuitBreaker, store: Store, result: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    refused = not breaker.allow("ends")
    store.up = True
    deadline = time.monotonic() + 10
    while not breaker.allow("ends") and time.monotonic() < deadline:
        time.sleep(0.01)
    result.put((refused, time.monotonic() < deadline))


def test_a_forked_process_probes_for_itself() -> None:
    """A prefork pool's child inherits an open breaker but not its thread."""
    store = Store()
    breaker = CircuitBreaker(0.1, "the store", probe=store.ping)
    breaker.failure(redis.ConnectionError("refused"), "publish")
    context = multiprocessing.get_context("fork")
    result = context.Queue()
    child = context.Process(target=_child_sees_the_store_again, args=(breaker, store, result))
    with warnings.catch_warnings():
        # Python 3.12+ warns that the parent's probing thread is not forked: that is the point.
        warnings.simplefilter("ignore", DeprecationWarning)
        child.start()
    refused, recovered = result.get(timeout=20)
    child.join(10)
    assert refused and recovered
    assert breaker.is_open  # the parent's store object never answered


def test_a_worker_process_that_never_publishes_says_nothing_about_publishing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    router = PriorityRouter(redis_url="redis://127.0.0.1:1/0", mode="inflight", cooldown=60)
    caplog.set_level(logging.INFO, "priority_router")
    for i in range(5):
        assert engine_of(router).end_quietly("acme", f"t{i}") is False
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "keeping documents' ends" in warnings[0]
    assert "publish" not in warnings[0]


def test_a_bug_in_a_quiet_call_does_not_open_the_breaker(caplog: pytest.LogCaptureFixture) -> None:
    import fakeredis

    router = PriorityRouter(redis_client=fakeredis.FakeRedis())

    def bug() -> None:
        raise TypeError("a bug")

    assert engine_of(router)._quietly(bug, "publish") is None
    assert engine_of(router)._quietly(bug, "publish") is None
    assert not engine_of(router)._breaker.is_open
    assert len([r for r in caplog.records if r.exc_info]) == 1
    assert router.decide("acme", "t1").pending == 0
