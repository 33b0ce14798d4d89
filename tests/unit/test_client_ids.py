import string

from hypothesis import given
from hypothesis import strategies as st

from priority_router.store.client_ids import (
    MAX_TOKEN_LENGTH,
    client_id_from_key,
    client_key,
    client_token,
    normalize_client_id,
)

PRINTABLE = set(string.printable) - set(string.whitespace)


def test_plain_ids_are_readable_in_keys() -> None:
    assert client_key("priority-router:", "acme") == "priority-router:{acme}"
    assert client_key("p:", "user@example.com") == "p:{user@example.com}"


def test_values_that_are_not_ids() -> None:
    for value in (None, "", "   ", "\n\t", [], ["a"], {"a": 1}, (), True, False, object()):
        assert normalize_client_id(value) is None


def test_numbers_and_bytes_become_ids() -> None:
    assert normalize_client_id(42) == "42"
    assert normalize_client_id(4.5) == "4.5"
    assert normalize_client_id(b"acme") == "acme"
    assert normalize_client_id(" acme ") == "acme"
    assert normalize_client_id(b"\xff\xfe") is not None


def test_hash_tag_syntax_and_long_ids_stay_safe() -> None:
    key = client_key("p:", "a{b}c")
    assert key.count("{") == 1 and key.count("}") == 1
    long_key = client_key("p:", "x" * 1_000_000)
    assert len(long_key) < 100
    assert client_key("p:", "x" * 1_000_000) != client_key("p:", "x" * 999_999)


@given(st.text(min_size=1) | st.binary(min_size=1).map(lambda b: b.decode("utf-8", "surrogateescape")))
def test_tokens_are_printable_bounded_and_without_braces(client_id: str) -> None:
    token = client_token(client_id)
    assert set(token) <= PRINTABLE
    assert "{" not in token and "}" not in token
    assert len(token) <= max(MAX_TOKEN_LENGTH, 33)


@given(st.text(min_size=1), st.text(min_size=1))
def test_distinct_ids_get_distinct_keys(a: str, b: str) -> None:
    if a != b:
        assert client_key("p:", a) != client_key("p:", b)


@given(st.text(min_size=1, max_size=20))
def test_short_ids_read_back_from_keys(client_id: str) -> None:
    key = client_key("p:", client_id)
    back = client_id_from_key("p:", key)
    if not client_token(client_id).startswith("#"):
        assert back == client_id
