"""The workers' daemon loops say once when their steps fail, and that they work again only
after a step that reached the store (integration/periodic.py)."""

from __future__ import annotations

import logging
import threading

import pytest

from priority_router.integration.periodic import Periodic


class Scripted(Periodic):
    doing = "the test's sweep"
    meanwhile = "nothing moves"

    def __init__(self, outcomes: list[object]) -> None:
        super().__init__("scripted", 0.001)
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


def _run(outcomes: list[object], caplog: pytest.LogCaptureFixture) -> list[str]:
    loop = Scripted(outcomes)
    with caplog.at_level(logging.DEBUG, "priority_router"):
        loop.start()
        assert loop.done.wait(5)
        loop.stop()
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]


def test_a_step_with_nothing_to_do_is_not_taken_for_a_recovery(caplog: pytest.LogCaptureFixture) -> None:
    down = ConnectionError("Connection refused")
    said = _run([down, False, down, False, True, True], caplog)
    assert said[0].startswith("priority-router: the test's sweep failed (ConnectionError")
    assert said[1:] == ["priority-router: the test's sweep works again"]  # once, after real work


def test_each_outage_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    down = ConnectionError("Connection refused")
    said = _run([down, down, down, True, down, True], caplog)
    assert [m.split(" (")[0] for m in said] == [
        "priority-router: the test's sweep failed",
        "priority-router: the test's sweep works again",
        "priority-router: the test's sweep failed",
        "priority-router: the test's sweep works again",
    ]
