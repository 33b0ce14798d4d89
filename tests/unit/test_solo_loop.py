"""A solo worker's event loop and its wake-up (integration/solo_loop.py), on kombu's own loop."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import pytest
from kombu.asynchronous import Hub

from priority_router.integration.solo_loop import Wakeup

Deliver = Callable[[], None]


@pytest.fixture
def loop() -> Iterator[tuple[Hub, Deliver]]:
    """kombu's loop polling a broker connection (a pipe), and what makes that readable."""
    hub = Hub()
    read, write = os.pipe()
    hub.add_reader(read, os.read, read, 1)
    yield hub, lambda: os.write(write, b"x") and None
    hub.close()
    os.close(read)
    os.close(write)


def _seconds_until_a_callback_queued_by_a_callback_runs(hub: Hub, deliver: Deliver, timer: float) -> float:
    """What a solo worker meets: a queued callback (kombu's reader draining the connection)
    runs a document, whose acknowledgement Celery queues in turn."""
    acknowledged: list[float] = []

    def acknowledge() -> None:
        acknowledged.append(time.monotonic())
        deliver()  # the broker's next document: the loop's poll returns

    hub.call_later(timer, lambda: None)  # the loop polls no longer than until its next timer
    hub.call_soon(lambda: hub.call_soon(acknowledge))
    turns = hub.create_loop()
    start = time.monotonic()
    while not acknowledged and time.monotonic() - start < 3 * timer:
        next(turns)
    assert acknowledged, "the callback never ran"
    return acknowledged[0] - start


def test_without_a_wakeup_the_loop_polls_until_its_timer_first(
    loop: tuple[Hub, Deliver],
) -> None:
    assert _seconds_until_a_callback_queued_by_a_callback_runs(*loop, timer=0.5) >= 0.4


def test_with_a_wakeup_it_runs_at_once(loop: tuple[Hub, Deliver]) -> None:
    hub, deliver = loop
    wakeup = Wakeup(hub)
    try:
        assert _seconds_until_a_callback_queued_by_a_callback_runs(hub, deliver, timer=5.0) < 1.0
    finally:
        wakeup.close()


def test_closing_the_wakeup_leaves_the_loop_as_it_was(loop: tuple[Hub, Deliver]) -> None:
    hub, _ = loop
    readers, ticks = dict(hub.readers), set(hub.on_tick)
    Wakeup(hub).close()
    assert hub.readers == readers
    assert hub.on_tick == ticks
