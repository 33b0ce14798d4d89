"""The counter store's schema marker: which layout of keys a store holds.

A router claims the store on its first use (``SET <prefix>schema <ours> NX``) and reads
the marker back.  A store marked with a schema this release does not read is refused:
the router counts nothing there (publishes fail open) rather than misread another
release's keys.  Reading alone (``peek``, ``inspect``, ``doctor``) marks nothing.  A release
that changes the layout raises :data:`SCHEMA`; the upgrade rule is in the CHANGELOG and
docs/lifecycle.md ("Upgrading").

Schema 1 is the layout of 0.1.0, which wrote no marker: a store without one is taken to
be schema 1 and marked so.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from ..errors import ConfigurationError
from ..forks import renew_after_fork

logger = logging.getLogger("priority_router")

#: The layout this release reads and writes.
SCHEMA = 1
#: Layouts this release reads and writes as its own.
READABLE = frozenset({1})
#: Seconds between re-reads of the marker (a store that was flushed is marked again).
RECHECK_SECONDS = 60.0


def schema_key(prefix: str) -> str:
    return f"{prefix}schema"


def marked_prefixes(client: redis.Redis, most: int = 100_000) -> list[str]:
    """The key prefixes routers have marked in this store (their schema markers), at most
    ``most`` of them, from a SCAN of the whole keyspace as ``status`` makes for its own
    prefix: for a reader that found nothing under its own."""
    found: set[str] = set()
    for seen, key in enumerate(client.scan_iter(match="*schema", count=1000)):
        if seen >= most:
            break
        name = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
        try:
            value = client.get(key)
        except redis.exceptions.NoPermissionError:
            continue  # a Redis user kept to its own prefix (docs/deployment.md) sees no other
        if isinstance(value, bytes) and value.isdigit():  # not some other application's "schema"
            found.add(name.removesuffix("schema"))
    return sorted(found)


class SchemaMismatch(ConfigurationError):
    """The store holds a layout this release does not read."""

    def __init__(self, key: str, found: str) -> None:
        self.key = key
        self.found = found
        super().__init__(
            "key_prefix",
            f"the counter store's keys under {key!r} are laid out by schema {found}, and this "
            f"release of priority-router reads schema {SCHEMA} only, so it counts nothing there and "
            "every document gets the default priority",
            "give this release a store of its own during the upgrade: a new key_prefix "
            "(PRIORITY_ROUTER_KEY_PREFIX, e.g. 'priority-router:v2:') on every publisher and worker "
            "of this release, and copy your tiers (priority-router tier list --json under the old "
            "prefix, tier set under the new one); or run the release that wrote schema "
            f"{found} everywhere",
        )


class StoreSchema:
    """Claims and checks one store's marker, at most every :data:`RECHECK_SECONDS`."""

    def __init__(self, client: redis.Redis, prefix: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._redis = client
        self.key = schema_key(prefix)
        self._clock = clock
        self._checked_at: float | None = None
        self._refused: SchemaMismatch | None = None
        self._claimed = False
        self._lock = threading.Lock()
        renew_after_fork(self)

    def after_fork(self) -> None:
        # Held across a round trip: another thread may hold it when a prefork pool forks.
        self._lock = threading.Lock()

    def check(self, claim: bool = True) -> None:
        """Raise :class:`SchemaMismatch` when the store is another release's (logged once, as
        an ERROR); Redis errors propagate.  Costs a round trip only when a re-check is due.
        With ``claim`` an unmarked store is marked as this release's; without, it is only
        read (a store without a marker is schema 1)."""
        checked = self._checked_at
        if checked is not None and self._clock() - checked < RECHECK_SECONDS and (self._claimed or not claim):
            if self._refused is not None:
                raise self._refused
            return
        with self._lock:
            found = self._claim() if claim else self._read()
            self._claimed = self._claimed or claim
            refused = None if found in {str(v) for v in READABLE} else SchemaMismatch(self.key, found)
            if refused is not None and self._refused is None:
                logger.error("priority-router: %s", refused)
            elif refused is None and self._refused is not None:
                logger.info("priority-router: the store %r is schema %s again; counting", self.key, found)
            self._refused = refused
            self._checked_at = self._clock()
        if refused is not None:
            raise refused

    def _read(self) -> str:
        found = self._redis.get(self.key)
        if found is None:
            return "1"  # unmarked: the layout of 0.1.0, which wrote no marker
        return found.decode(errors="replace") if isinstance(found, bytes) else str(found)

    def _claim(self) -> str:
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(self.key, SCHEMA, nx=True)
            pipe.get(self.key)
            _, found = pipe.execute()
        return found.decode(errors="replace") if isinstance(found, bytes) else str(found)
