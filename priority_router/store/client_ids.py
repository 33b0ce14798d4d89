"""Client ids: which values are ids, and how an id becomes a short Redis key.

The encoding is injective: two distinct ids never share a key.  Short ids are
percent-escaped (so ``{``, ``}``, ``:``, ``*``, control bytes and non-ASCII never
reach the key text raw); ids whose escaped form is long are replaced by a hash
marked with ``#``, a character the escaped form never contains.  The token sits in
a ``{hash tag}`` so that on Redis Cluster one client's key has one slot.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from urllib.parse import quote, unquote_to_bytes

#: Escaped ids longer than this are hashed, keeping every key short.
MAX_TOKEN_LENGTH = 64
_SAFE = "-_.@"
_HASH_MARK = "#"


def normalize_client_id(value: object) -> str | None:
    """The client id for a raw header/kwarg value, or None when it cannot be one.

    Strings are kept (surrounding whitespace is not part of an id), numbers are
    written in decimal, bytes are decoded as UTF-8 (invalid bytes survive via
    ``surrogateescape``).  None, booleans, containers, and empty or blank values
    are not ids.
    """
    if type(value) is str:
        return value.strip() or None
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        value = bytes(value).decode("utf-8", "surrogateescape")
    elif isinstance(value, int | float):
        value = repr(value)
    if not isinstance(value, str):
        return None
    return value.strip() or None


@lru_cache(maxsize=4096)
def client_token(client_id: str) -> str:
    """The printable, bounded token that stands for ``client_id`` in keys."""
    raw = client_id.encode("utf-8", "surrogateescape")
    token = quote(raw, safe=_SAFE)
    if len(token) <= MAX_TOKEN_LENGTH:
        return token
    return _HASH_MARK + hashlib.blake2b(raw, digest_size=16).hexdigest()


def client_key(prefix: str, client_id: str) -> str:
    """The Redis key of one client's counter."""
    return f"{prefix}{{{client_token(client_id)}}}"


def client_id_from_key(prefix: str, key: str) -> str | None:
    """Inverse of :func:`client_key` for display; hashed ids come back as ``#<hash>``."""
    if not (key.startswith(prefix + "{") and key.endswith("}")):
        return None
    token = key[len(prefix) + 1 : -1]
    if token.startswith(_HASH_MARK):
        return token
    return unquote_to_bytes(token).decode("utf-8", "backslashreplace")


def glob_escape(text: str) -> str:
    """``text`` with Redis glob characters escaped, for SCAN's MATCH."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


#: Ends the key of one client's in-flight set (inflight mode); a seed counter key ends
#: with its hash tag's ``}``, so the two never collide and neither SCAN pattern matches the other.
INFLIGHT_SUFFIX = ":i"


def inflight_key(prefix: str, client_id: str) -> str:
    """The Redis key of one client's set of in-flight documents (inflight mode)."""
    return f"{prefix}{{{client_token(client_id)}}}{INFLIGHT_SUFFIX}"


def client_id_from_inflight_key(prefix: str, key: str) -> str | None:
    """Inverse of :func:`inflight_key` for display."""
    if not key.endswith("}" + INFLIGHT_SUFFIX):
        return None
    return client_id_from_key(prefix, key[: -len(INFLIGHT_SUFFIX)])


#: Ends the key of one client's order (inflight mode): the count its newest document in
#: flight was checked at, and that document (``store/lua/publish_inflight.lua``).
ORDER_SUFFIX = ":o"


#: Ends the key of one client's documents counted and not yet confirmed sent by their
#: publisher (inflight mode, ``store/inflight.py``).
UNCONFIRMED_SUFFIX = ":u"


#: Ends the key of one client's tier (``tiers.py``).  It shares the client's hash tag, so on
#: Redis Cluster it lives on the client's master and is read inside the client's check.
TIER_SUFFIX = ":t"


def tier_key(prefix: str, client_id: str) -> str:
    """The Redis key of one client's tier."""
    return f"{prefix}{{{client_token(client_id)}}}{TIER_SUFFIX}"


def client_id_from_tier_key(prefix: str, key: str) -> str | None:
    """Inverse of :func:`tier_key` for display."""
    if not key.endswith("}" + TIER_SUFFIX):
        return None
    return client_id_from_key(prefix, key[: -len(TIER_SUFFIX)])


def default_tier_key(prefix: str) -> str:
    """The Redis key of the tier of every client without one of its own."""
    return f"{prefix}tier-default"


def tiers_in_use_key(prefix: str) -> str:
    """The Redis key whose presence says some tier has been stored under ``prefix``."""
    return f"{prefix}tiers-in-use"


#: Ends the keys of one client's gate (``store/gate.py``): its running documents, the ids of
#: its held documents in order (their messages wait in the broker), its tokens and units,
#: and its released documents on their way back.  They share the client's hash tag, so the
#: gate's script runs on one Redis Cluster slot.
GATE_SUFFIXES = (":run", ":held", ":gate", ":sent")


def gate_keys(prefix: str, client_id: str) -> list[str]:
    """The Redis keys of one client's gate, in the order ``gate.lua`` takes them."""
    base = f"{prefix}{{{client_token(client_id)}}}"
    return [base + suffix for suffix in GATE_SUFFIXES]


def held_index_key(prefix: str) -> str:
    """The sorted set of clients with held documents, by when a worker should look again."""
    return f"{prefix}held-clients"


def limits_key(prefix: str) -> str:
    """The hash of every client's own limits (an empty value: a tier of its own without limits)."""
    return f"{prefix}limits"


def default_limits_key(prefix: str) -> str:
    """The limits of every client without a tier of its own."""
    return f"{prefix}limits-default"


def limits_version_key(prefix: str) -> str:
    """A number raised by every change of limits, so workers read them again only then."""
    return f"{prefix}limits-version"
