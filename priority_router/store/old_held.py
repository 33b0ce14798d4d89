"""Documents an older release's gate held in the counter store, until a worker of this
release adopts them (``integration/adopt.py``, docs/lifecycle.md).

Builds that reported 0.1.0, up to b0b0e69, kept a held document's message in the client's
``<prefix>{<client>}:msg`` hash; this release keeps held documents in the broker and never
reads that hash, and both mark the store schema 1.  :meth:`OldHeld.claim` moves messages
from ``:msg`` to ``:adopting`` (``lua/adopt.lua``), where an older worker still running no
longer releases them; the adopter publishes each to the broker, then :meth:`OldHeld.done`
deletes it.  A lock per client keeps two adopters apart; an adopter killed mid-way leaves
its claims in ``:adopting`` for the next one, once its lock has run out.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from .client_ids import GATE_SUFFIXES, client_id_from_key, client_key, glob_escape
from .client_keys import scanned
from .permissions import register_script

_LUA = Path(__file__).parent / "lua" / "adopt.lua"
#: The older release's hash of held messages, and this release's hash of those being moved.
MSG, ADOPTING, LOCK = ":msg", ":adopting", ":adopt-lock"
#: Milliseconds an adopter's lock lasts without a new claim (a claim takes well under one).
LOCK_MS = 10_000
#: Most messages one claim moves.
CLAIM_BATCH = 100


class OldHeld:
    """The older release's held documents in one counter store."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._redis = client
        self._prefix = prefix
        self._token = uuid.uuid4().hex
        self._script: Any = None

    def bases(self) -> Iterator[str]:
        """The key base (``<prefix>{<token>}``) of every client with documents in ``:msg`` or
        ``:adopting``, by one SCAN of the store."""
        seen: set[str] = set()
        for suffix in (MSG, ADOPTING):
            for batch in scanned(self._redis, f"{glob_escape(self._prefix)}{{*}}{suffix}", 500):
                for key in batch:
                    base = key[: -len(suffix)]
                    if base not in seen:
                        seen.add(base)
                        yield base

    def client_of(self, base: str) -> str | None:
        """The client id of a key base: read from its token, or None when the token is a hash
        (the caller reads it from a message's headers)."""
        client = client_id_from_key(self._prefix, base)
        return None if client is None or client.startswith("#") else client

    def sample(self, base: str) -> bytes | None:
        """One message of the client's, to read its client id from."""
        for suffix in (ADOPTING, MSG):
            for task_id in self._redis.hkeys(base + suffix)[:1]:
                message: Any = self._redis.hget(base + suffix, task_id)
                if message is not None:
                    return message if isinstance(message, bytes) else str(message).encode()
        return None

    def counts(self) -> dict[str, int]:
        """Documents still in the older release's layout, by client (hashed ids by token)."""
        counts: dict[str, int] = {}
        for base in self.bases():
            with self._redis.pipeline(transaction=False) as pipe:
                pipe.hlen(base + MSG)
                pipe.hlen(base + ADOPTING)
                found = sum(int(n) for n in pipe.execute())
            if found:
                name = client_id_from_key(self._prefix, base) or base
                counts[name] = counts.get(name, 0) + found
        return counts

    def count(self, client_id: str) -> int:
        """One client's documents still in the older release's layout."""
        base = client_key(self._prefix, client_id)
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.hlen(base + MSG)
            pipe.hlen(base + ADOPTING)
            return sum(int(n) for n in pipe.execute())

    def claim(
        self, base: str, limited: bool, now_ms: int, most: int = CLAIM_BATCH
    ) -> list[tuple[str, bytes]] | None:
        """Claim up to ``most`` more of the client's messages (counted held when ``limited``):
        every (task id, message) claimed and not yet done, or None when another worker
        adopts this client's now."""
        reply = self._call(base, "claim", now_ms, LOCK_MS, int(limited), most)
        if int(reply[0]) == 0:
            return None
        return [(_text(reply[i]), bytes(reply[i + 1])) for i in range(1, len(reply) - 1, 2)]

    def done(self, base: str, task_id: str) -> None:
        """The document is in the broker: forget its message."""
        self._redis.hdel(base + ADOPTING, task_id)

    def unlock(self, base: str) -> None:
        self._call(base, "unlock", 0)

    def _call(self, base: str, mode: str, *args: object) -> Any:
        if self._script is None:
            self._script = register_script(self._redis, _LUA.read_text())
        run, held, gate, _ = (base + suffix for suffix in GATE_SUFFIXES)
        keys = [run, held, base + MSG, gate, base + ADOPTING, base + LOCK]
        return self._script(keys=keys, args=[mode, self._token, *args])


def _text(value: object) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def describe_old_held(counts: dict[str, int]) -> str:
    """:meth:`OldHeld.counts` in words, the problem and the fix, the first ten clients named."""
    shown = ", ".join(f"{client!r} ({n})" for client, n in sorted(counts.items())[:10])
    return (
        f"{sum(counts.values())} document(s) are held by an older release's workers in the counter "
        f"store ({{client}}{MSG} hashes: builds that reported 0.1.0, up to b0b0e69), of {shown}; "
        "no worker of this release has adopted them yet, and only one does. Fix: start a worker of "
        "this release (it moves them to the broker within a minute, docs/lifecycle.md)"
    )
