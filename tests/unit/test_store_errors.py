"""Store errors as the CLI and doctor print them (store/connection.py's store_error)."""

from __future__ import annotations

import redis
from redis.sentinel import Sentinel

from priority_router.store.connection import store_error


def test_sentinels_that_do_not_answer_are_one_short_line() -> None:
    sentinel = Sentinel([("127.0.0.1", 1), ("127.0.0.1", 2)], sentinel_kwargs={"retry": None})
    try:
        sentinel.discover_master("documents")
    except redis.ConnectionError as exc:
        raw, said = str(exc), store_error(exc)
    assert len(raw) > 500  # redis-py lists each Sentinel client's repr
    assert said == "MasterNotFoundError: No master found for 'documents' (no Sentinel answered)"


def test_other_errors_keep_their_type_and_text() -> None:
    assert store_error(redis.TimeoutError("Timeout reading from socket")) == (
        "TimeoutError: Timeout reading from socket"
    )
