"""Whose document a message is when its client id header is missing (integration/clients.py)."""

from __future__ import annotations

import logging

import pytest

from priority_router.integration.clients import client_from_call


def test_the_keyword_names_the_client_before_the_getter() -> None:
    def getter(*_: object) -> str:
        raise AssertionError("not asked when the keyword names the client")

    assert client_from_call("client_id", getter, "doc", (), {"client_id": " acme "}, {}) == "acme"


def test_the_getter_answers_when_the_keyword_is_missing_and_its_failure_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert client_from_call("client_id", lambda n, a, k, h: a[0], "doc", ("beta",), {}, {}) == "beta"
    assert client_from_call("client_id", None, "doc", ("beta",), {}, {}) is None

    def broken(*_: object) -> str:
        raise KeyError("tenant")

    with caplog.at_level(logging.ERROR, "priority_router"):
        assert client_from_call("client_id", broken, "doc", (), {}, {}) is None
    assert "client_id_getter failed for doc" in caplog.text
