"""The publisher's judgement of its queues' Redis priority lists (``integration/stranded.py``):
which lists a worker skips, and saying so once per outage."""

from __future__ import annotations

import logging
import time

import fakeredis
import pytest
from celery import Celery
from kombu.exceptions import OperationalError
from test_receiver import publish

from priority_router import PriorityRouter
from priority_router.integration.stranded import IDLE_AFTER, Judge, ListState, skipped

Q = "documents"


def lists(**held: tuple[int, str, float | None] | tuple[int, str, float | None, bool]) -> list[ListState]:
    """Ten lists, most urgent first; ``s3=(length, oldest tag, its publish time[, put back])``."""
    found = []
    for step in range(10):
        key = Q if step == 0 else f"{Q}\x06\x16{step}"
        state = held.get(f"s{step}")
        if state is None:
            found.append(ListState(key, 0, "", None, False))
        else:
            length, tail, at, *put_back = state
            found.append(ListState(key, length, tail, at, bool(put_back and put_back[0])))
    return found


def key(step: int) -> str:
    return f"{Q}\x06\x16{step}"


def test_a_list_whose_old_document_stayed_while_this_process_s_younger_one_went_is_skipped() -> None:
    # A burst at 1, 1, 2, 3, 3: the worker took the 3s (polling 0, 3, 6, 9) and is idle.
    now = lists(s1=(2, "a", 100.0), s2=(1, "c", 100.2))
    assert skipped(now, None, {key(3): 100.4}) == {1: "a", 2: "c"}


def test_nothing_is_skipped_when_this_process_published_to_the_emptied_list_before() -> None:
    # The less urgent document was taken before the older one arrived: a worker polling
    # every list does that when the more urgent list was empty.
    assert skipped(lists(s1=(2, "a", 100.0)), None, {key(3): 99.0}) == {}


def test_a_draining_backlog_is_not_skipped() -> None:
    # A router worker drains 1 first: its oldest document changes; 2..9 wait, unchanged.
    before = lists(s1=(5, "a", 100.0), s2=(4, "b", 100.1), s9=(3, "z", 100.9))
    now = lists(s1=(2, "d", 100.3), s2=(4, "b", 100.1), s9=(3, "z", 100.9))
    assert skipped(now, before, {key(1): 101.0, key(2): 101.0, key(9): 101.0}) == {}


def test_lists_nobody_takes_from_are_not_skipped() -> None:
    # Every worker busy or down: nothing moves, whatever waits.
    before = lists(s1=(5, "a", 100.0), s3=(4, "c", 100.1))
    assert skipped(before, before, {key(3): 100.5}) == {}


def test_a_less_urgent_list_that_moved_while_this_one_stayed_shows_it_skipped() -> None:
    # A busy blind worker: 3's oldest went between the looks, 1's stayed.
    before = lists(s1=(5, "a", 100.0), s3=(9, "c", 100.5))
    now = lists(s1=(6, "a", 100.0), s3=(9, "e", 101.0))
    assert skipped(now, before, {key(3): 102.0}) == {1: "a"}


def test_max_wait_moving_an_older_document_shows_nothing() -> None:
    # The sweeper moves overdue documents oldest first: 3's was older than 1's.
    before = lists(s1=(5, "a", 100.0), s3=(9, "c", 90.0))
    now = lists(s1=(5, "a", 100.0), s3=(8, "d", 95.0))
    assert skipped(now, before, {}) == {}


def test_a_document_put_back_is_not_judged_by_its_age() -> None:
    # kombu restored it (a worker shut down holding it), or the gate released it from its
    # client's holding queue: it may have left the list meanwhile.
    assert skipped(lists(s1=(1, "a", 100.0, True)), None, {key(3): 100.5}) == {}
    # Nor is a less urgent list whose oldest is a document put back.
    before = lists(s1=(5, "a", 100.0), s3=(9, "c", 100.5))
    now = lists(s1=(5, "a", 100.0), s3=(10, "r", 100.2, True))
    assert skipped(now, before, {}) == {}


def test_a_document_taken_and_put_back_between_two_looks_shows_nothing() -> None:
    # A worker took 1's only document (1 was empty), then 3's, then shut down: kombu put
    # the first back, the oldest of 1 again.
    before = lists(s1=(1, "a", 100.0), s3=(1, "c", 100.5))
    now = lists(s1=(1, "a", 100.0, True))
    assert skipped(now, before, {}) == {}


def test_the_queue_s_own_list_is_never_judged() -> None:
    # Every worker polls it; max_wait moves overdue documents there, old as they are.
    assert skipped(lists(s0=(1, "a", 100.0)), None, {key(3): 100.5}) == {}


def test_a_document_without_a_publish_time_is_not_judged() -> None:
    assert skipped(lists(s1=(1, "a", None)), None, {key(3): 100.5}) == {}


def test_the_judge_says_it_once_per_queue_after_two_looks_and_once_when_taken_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    judge = Judge()
    stranded = lists(s1=(6, "a", 100.0), s2=(2, "b", 100.1))
    pushed = {key(3): 100.3}
    with caplog.at_level(logging.INFO, "priority_router"):
        judge.look(Q, stranded, pushed)
        assert caplog.records == [], "one look is not enough"
        judge.look(Q, stranded, pushed)
        (warning,) = caplog.records
        assert warning.levelno == logging.WARNING
        said = warning.getMessage()
        assert f"8 document(s) of queue {Q!r}" in said
        assert f"{key(1)!r} (6), {key(2)!r} (2)" in said
        assert "install the router in the app of the workers" in said and "list(range(10))" in said
        for _ in range(5):  # the same outage, and more documents in it
            judge.look(Q, lists(s1=(9, "a", 100.0), s2=(2, "b", 100.1), s4=(1, "f", 100.6)), pushed)
        assert len(caplog.records) == 1
        judge.look(Q, lists(), pushed)  # the workers take from those lists again
        assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.INFO]
        assert "have left them (a worker takes from those lists again" in caplog.records[1].getMessage()
        for _ in range(2):  # a new outage is said again
            judge.look(Q, lists(s1=(1, "g", 200.0)), {key(9): 200.5})
        assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.INFO, logging.WARNING]


def test_a_list_skipped_at_one_look_only_is_not_said(caplog: pytest.LogCaptureFixture) -> None:
    judge = Judge()
    with caplog.at_level(logging.INFO, "priority_router"):
        judge.look(Q, lists(s1=(1, "a", 100.0)), {key(3): 100.5})
        judge.look(Q, lists(s1=(1, "b", 100.7)), {key(3): 100.5})  # it was taken
        judge.look(Q, lists(s1=(1, "b", 100.7)), {key(3): 100.5})
    assert caplog.records == []


# -- which publishes are watched ----------------------------------------------------------


def _redis_app() -> Celery:
    return Celery("unit", broker="redis://127.0.0.1:1/0", set_as_current=False)


def test_a_publish_on_redis_notes_its_list_and_starts_the_looks() -> None:
    app = _redis_app()
    router = PriorityRouter(redis_client=fakeredis.FakeRedis())
    receiver = router.install(app)
    try:
        watch = receiver.stranded_watch
        assert watch is not None
        for _ in range(4):
            publish(receiver, app, headers={"client_id": "acme"})
        assert set(watch.pushed) == {("celery", 1), ("celery", 2)}
        assert watch._thread is not None and watch._thread.daemon
    finally:
        router.uninstall(app)


@pytest.mark.parametrize("broker", ["amqp://guest:guest@127.0.0.1:1//", "redis"])
def test_rabbitmq_dry_run_and_workers_are_not_watched(broker: str) -> None:
    app = _redis_app() if broker == "redis" else Celery("unit", broker=broker, set_as_current=False)
    dry = broker == "redis"
    router = PriorityRouter(redis_client=fakeredis.FakeRedis(), dry_run=dry)
    receiver = router.install(app)
    try:
        watch = receiver.stranded_watch
        assert watch is not None
        publish(receiver, app, headers={"client_id": "acme"})
        assert watch.pushed == {} and watch._thread is None
        receiver.in_worker()
        assert receiver.stranded_watch is None
    finally:
        router.uninstall(app)


def test_a_process_that_stopped_publishing_stops_looking_unless_something_is_stranded() -> None:
    app = _redis_app()
    router = PriorityRouter(redis_client=fakeredis.FakeRedis())
    watch = router.install(app).stranded_watch
    try:
        assert watch is not None
        watch.pushed[("celery", 3)] = time.time()
        assert not watch._idle()
        watch.pushed[("celery", 3)] = time.time() - IDLE_AFTER - 1
        assert watch._idle()
        watch.judge.stranded["celery"] = {1: "a"}
        assert not watch._idle(), "it looks on until the stranded documents are taken"
    finally:
        router.uninstall(app)


def test_a_publish_the_broker_refused_is_not_noted() -> None:
    """A document that never reached its list cannot show a worker taking from it."""
    app = _redis_app()
    app.conf.broker_transport_options = {"max_retries": 0}  # refused at once
    router = PriorityRouter(redis_client=fakeredis.FakeRedis())
    watch = router.install(app).stranded_watch
    try:
        assert watch is not None
        watch.pushed[("celery", 1)] = 50.0
        with pytest.raises(OperationalError):
            app.send_task("docs.process", headers={"client_id": "acme"}, retry=False)
        assert watch.pushed == {("celery", 1): 50.0}, "what it noted of earlier publishes stays"
    finally:
        router.uninstall(app)
