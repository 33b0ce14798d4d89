"""The workers' daemon loops say once when their steps fail, and that they work again only
after a step that reached the store (integration/periodic.py)."""

from __future__ import annotations

import logging
import re
import threading

import pytest

from priority_router.integration.periodic import Periodic


class Scripted(Periodic):
    doing = "the test's sweep"
    meanwhile = "nothing moves"

    def __init__(self, outcomes: list[object], steady: float) -> None:
        super().__init__("scripted", 0.001)
        self.steady = steady
        self.outcomes = outcomes
        self.done = threading.Event()

    def step(self) -> bool:
        if not self.outcomes:
            self.done.set()
            return False
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return bool(outcome)


def _run(outcomes: list[object], caplog: pytest.LogCaptureFixture, steady: float = 0) -> list[str]:
    loop = Scripted(outcomes, steady)
    with caplog.at_level(logging.DEBUG, "priority_router"):
        loop.start()
        assert loop.done.wait(5)
        loop.stop()
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]


def test_a_step_with_nothing_to_do_is_not_taken_for_a_recovery(caplog: pytest.LogCaptureFixture) -> None:
    down = ConnectionError("Connection refused")
    said = _run([down, False, down, False, True, True], caplog)
    assert said[0].startswith("priority-router: the test's sweep failed (ConnectionError")
    # Once, after real work; said when it has held, so it names when it came back.
    assert [m.split(" (")[0] for m in said[1:]] == ["priority-router: the test's sweep works again"]
    assert re.search(r"works again \(since \d+ s ago\)$", said[1])


def test_each_outage_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    down = ConnectionError("Connection refused")
    said = _run([down, down, down, True, down, True], caplog)
    assert [m.split(" (")[0] for m in said] == [
        "priority-router: the test's sweep failed",
        "priority-router: the test's sweep works again",
        "priority-router: the test's sweep failed",
        "priority-router: the test's sweep works again",
    ]


def test_a_store_that_fails_every_other_step_is_one_failure_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A store over ``maxmemory`` that cannot evict answers reads and refuses writes: the
    gate's steps alternate, and each pair said "failed" and "works again" every 2 s."""
    oom = ConnectionError("OOM command not allowed when used memory > 'maxmemory'")
    said = _run([oom, True] * 20, caplog, steady=0.5)
    assert [m.split(" (")[0] for m in said] == ["priority-router: the test's sweep failed"]
    said = _run([oom, True, oom] + [True] * 400, caplog, steady=0.05)  # then it truly works
    assert [m.split(" (")[0] for m in said][-1] == "priority-router: the test's sweep works again"
