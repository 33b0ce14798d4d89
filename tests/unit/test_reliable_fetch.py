"""The reliable fetch's choice of command (integration/reliable_fetch.py); it runs on a real
Redis in tests/contract/test_fetch.py and under SIGKILLs in tests/integration/test_faults.py."""

from __future__ import annotations

import logging
from queue import Empty
from typing import Any
from unittest import mock

import pytest
from kombu.utils.scheduling import round_robin_cycle

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
    sent = fetch.command()
    assert sent is not None and sent[:3] == ["EVAL", reliable_fetch.SCRIPT, 4]
    assert sent[3:] == ["unacked_index", "unacked", "q", "q:1"]
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
    assert len(warnings) == 1 and "fetch script" in warnings[0] and "EVAL and BLMOVE" in warnings[0]


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
