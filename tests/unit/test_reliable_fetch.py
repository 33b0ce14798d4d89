"""The reliable fetch's choice of command (integration/reliable_fetch.py); it runs on a real
Redis in tests/contract/test_fetch.py and under SIGKILLs in tests/integration/test_faults.py."""

from __future__ import annotations

import logging
from queue import Empty
from typing import Any
from unittest import mock

import pytest
from kombu.utils.scheduling import round_robin_cycle
from redis.exceptions import NoScriptError

from priority_router.integration import reliable_fetch
from priority_router.integration.reliable_fetch import ReliableFetch


class Refused(Exception):
    pass


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def channel() -> Any:
    chan = mock.Mock(active_queues={"q"}, priority_steps=[0, 1], global_keyprefix="", brpop_timeout=1)
    chan._queue_cycle = round_robin_cycle(["q"])
    chan._q_for_pri = lambda queue, pri: queue if pri == 0 else f"{queue}:{pri}"
    chan.unacked_key, chan.unacked_index_key = "unacked", "unacked_index"
    chan.ResponseError = Refused
    return chan


def message() -> str:
    return "delivered"


def nothing() -> None:
    raise Empty()


def refused() -> None:
    raise Refused("NOPERM")


def test_it_fetches_while_it_finds_documents_and_waits_once_after_finding_none() -> None:
    fetch = ReliableFetch(channel(), idle_step=1)
    first = fetch.command()
    assert first == ["EVAL", reliable_fetch.SCRIPT, 4, "unacked_index", "unacked", "q", "q:1"]
    assert fetch.read(message) == "delivered"
    sent = fetch.command()  # the broker has the script now
    assert sent == ["EVALSHA", reliable_fetch.SHA, *first[2:]]
    assert fetch.read(message) == "delivered"
    assert fetch.command() == sent
    with pytest.raises(Empty):
        fetch.read(nothing)
    assert fetch.command() == ["BLMOVE", "q:1", "q:1", "RIGHT", "RIGHT", reliable_fetch.WAIT]
    with (
        mock.patch.object(reliable_fetch.celery_internals, "read_other", side_effect=Empty),
        pytest.raises(Empty),
    ):
        fetch.read(message)
    assert fetch.command() == sent


def test_a_refused_command_is_replaced_by_brpop_said_once_and_tried_again_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    fetch = ReliableFetch(channel(), clock=clock)
    with caplog.at_level(logging.WARNING, "priority_router"):
        for _ in range(3):
            assert fetch.command()[0] == "EVAL"  # type: ignore[index]
            with pytest.raises(Empty):
                fetch.read(refused)
            for _ in range(2):  # kombu's BRPOP until RETRY seconds have passed
                assert fetch.command() == ["BRPOP", "q", "q:1", 1]
                assert fetch.read(message) == "delivered"
                clock.now += reliable_fetch.RETRY / 2
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "fetch script" in warnings[0] and "EVAL, EVALSHA and BLMOVE" in warnings[0]


def test_a_refused_brpop_is_kombus_error() -> None:
    clock = Clock()
    fetch = ReliableFetch(channel(), clock=clock)
    fetch.command()
    with pytest.raises(Empty):
        fetch.read(refused)
    assert fetch.command()[0] == "BRPOP"  # type: ignore[index]
    with pytest.raises(Refused):
        fetch.read(refused)


def test_a_channel_without_queues_sends_nothing() -> None:
    chan = channel()
    chan.active_queues = set()
    chan._queue_cycle = round_robin_cycle([])
    assert ReliableFetch(chan).command() is None


def test_a_broker_that_lost_the_script_is_sent_it_again_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fetch = ReliableFetch(channel())
    fetch.command()
    fetch.read(message)
    assert fetch.command()[0] == "EVALSHA"  # type: ignore[index]

    def lost() -> None:
        raise NoScriptError("NOSCRIPT No matching script")

    with caplog.at_level(logging.WARNING, "priority_router"), pytest.raises(Empty):
        fetch.read(lost)
    assert fetch.command()[0] == "EVAL"  # type: ignore[index]
    assert caplog.records == []


def test_kombu_records_again_only_what_the_script_did_not_take() -> None:
    fetch = ReliableFetch(channel())
    taken = mock.Mock(delivery_tag="tag", delivery_info={"exchange": "q"})
    seen: list[bool] = []
    fetch.command()
    fetch.read(lambda: seen.append(fetch.recorded(taken)))  # delivered from the script's reply
    assert not fetch.recorded(taken)  # between deliveries
    fetch.command()
    with pytest.raises(Empty):
        fetch.read(refused)
    assert fetch.command()[0] == "BRPOP"  # type: ignore[index]
    fetch.read(lambda: seen.append(fetch.recorded(taken)))  # delivered from kombu's BRPOP
    assert seen == [True, False]


def test_a_redis_error_of_the_consumer_is_not_taken_for_a_refusal(caplog: pytest.LogCaptureFixture) -> None:
    fetch = ReliableFetch(channel())
    taken = mock.Mock(delivery_tag="tag", delivery_info={"exchange": "q"})

    def consumer_fails() -> None:
        fetch.recorded(taken)  # the message reached kombu's consumer
        raise Refused("WRONGTYPE in the consumer's own call")

    fetch.command()
    with caplog.at_level(logging.WARNING, "priority_router"), pytest.raises(Refused):
        fetch.read(consumer_fails)
    assert caplog.records == []
    assert fetch.command()[0] == "EVALSHA"  # type: ignore[index]
