"""Where tiers live: one string key per client with a tier, and one for the default tier.

A client's tier key (``<prefix>{token}:t``) shares the client's hash tag, so the publish's
own check reads it in its transaction (``counter.py``, ``inflight.py``), on Redis Cluster
too.  The default tier (``<prefix>tier-default``) cannot share every client's slot, so a
publisher keeps it in memory and reads it again at most every ``refresh`` seconds, with
the marker ``<prefix>tiers-in-use`` that setting any tier writes: until a deployment has
a tier, checks leave the tier's ``GET`` out and cost what they cost without tiers.  So the
first tier of a deployment takes effect within ``refresh`` seconds, and after that a
client's tier at its next publish.  Tier keys never expire (they are configuration, not
counts) and ``reset --all`` leaves them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import redis

from ..errors import ConfigurationError
from ..tiers import Tier, decode
from .client_ids import (
    TIER_SUFFIX,
    client_id_from_tier_key,
    default_tier_key,
    glob_escape,
    tier_key,
    tiers_in_use_key,
)
from .client_keys import scanned
from .writes import Writes

logger = logging.getLogger("priority_router")

#: Seconds a publisher keeps the default tier before reading it again.
DEFAULT_TIER_REFRESH = 5.0


class TierStore:
    """Reads and writes tiers in the counter store."""

    def __init__(self, client: redis.Redis, prefix: str, refresh: float = DEFAULT_TIER_REFRESH) -> None:
        self._redis = client
        self._prefix = prefix
        #: Seconds this process keeps the default tier and the in-use marker before reading
        #: them again.
        self.refresh = refresh
        self._default_key = default_tier_key(prefix)
        self._marker = tiers_in_use_key(prefix)
        self._in_use = False
        self._pattern = glob_escape(prefix) + "{*}" + glob_escape(TIER_SUFFIX)
        self._cached: Tier | None = None
        self._cached_until = 0.0
        self._warned = False

    def key(self, client_id: str) -> str:
        return tier_key(self._prefix, client_id)

    def stored(self, client_id: str) -> bytes | str | None:
        """The client's own tier as stored (what a tiered check reads), None when it has none."""
        stored: bytes | str | None = self._redis.get(self.key(client_id))
        return stored

    def get(self, client_id: str) -> Tier | None:
        """The client's own tier, None when it has none (ConfigurationError: stored badly)."""
        stored = self.stored(client_id)
        return None if stored is None else decode(stored)

    def set(self, client_id: str, tier: Tier, writes: Writes) -> None:
        """Queue the client's tier in ``writes`` (the tier change's transaction)."""
        # A tier that adjusts no priority (only limits, or --neutral) matters to publishers
        # only beside a default tier, which marks the deployment itself: until then their
        # checks stay bare.
        if tier.encode():
            self._mark_in_use()
        writes.set(self.key(client_id), tier.encode())

    def unset(self, client_id: str, writes: Writes) -> None:
        """Queue the removal of the client's tier; its first reply: whether it had one."""
        writes.delete(self.key(client_id))

    def get_default(self) -> Tier | None:
        stored = self._redis.get(self._default_key)
        return None if stored is None else decode(stored)

    def set_default(self, tier: Tier, writes: Writes) -> None:
        """Queue the default tier's priority part; one that adjusts no priority (limits
        only) is no default tier for publishers, and any stored one goes."""
        if not tier.encode():
            self.unset_default(writes)
            return
        self._mark_in_use()
        writes.set(self._default_key, tier.encode())
        self._cached, self._cached_until = tier, time.monotonic() + self.refresh

    def unset_default(self, writes: Writes) -> None:
        """Queue the removal of the default tier; its first reply: whether there was one."""
        self._cached, self._cached_until = None, time.monotonic() + self.refresh
        writes.delete(self._default_key)

    def in_use(self) -> bool:
        """Whether any tier has been stored, as this process last read it.  A failed read
        raises: the check it is part of then fails at once, instead of waiting for the store
        a second time in the same publish."""
        self._fresh(strict=True)
        return self._in_use

    def default(self) -> Tier | None:
        """The default tier as this process last read it (never raises)."""
        self._fresh()
        return self._cached

    def known_default(self) -> Tier | None:
        """The default tier as this process last read it, without reading the store."""
        return self._cached

    def _mark_in_use(self) -> None:
        # Written before the tier's transaction (on a cluster the marker may live on another
        # master), so a publisher that sees a tier also sees the marker.
        self._redis.set(self._marker, "1")
        self._in_use = True

    def _fresh(self, strict: bool = False) -> None:
        """Read the default tier and the marker again once ``refresh`` seconds have passed;
        a failed read keeps what was read before and tries again after ``refresh``."""
        now = time.monotonic()
        if now < self._cached_until:
            return
        self._cached_until = now + self.refresh
        try:
            with self._redis.pipeline(transaction=False) as pipe:
                pipe.get(self._default_key)
                pipe.exists(self._marker)
                stored, marked = pipe.execute()
            self._in_use = bool(marked) or stored is not None
            self._cached = None if stored is None else decode(stored)
            self._warned = False
        except redis.RedisError:
            if strict:
                raise
            # default(), after a check that worked: keep what was read before
        except ConfigurationError as exc:
            if not self._warned:
                self._warned = True
                logger.error(
                    "priority-router: the default tier at %s is unreadable (%s); keeping %s. Fix: %s",
                    self._default_key,
                    exc.problem,
                    "none" if self._cached is None else self._cached.describe(),
                    exc.fix,
                )

    def scan(self, count: int = 500) -> Iterator[tuple[str, Tier | ConfigurationError]]:
        """Every client with a tier of its own, and its tier (or why it cannot be read)."""
        for batch in scanned(self._redis, self._pattern, count):
            yield from self._read(batch)

    def _read(self, keys: list[str]) -> Iterator[tuple[str, Tier | ConfigurationError]]:
        with self._redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.get(key)
            values = pipe.execute()
        for key, stored in zip(keys, values, strict=True):
            client_id = client_id_from_tier_key(self._prefix, key)
            if client_id is None or stored is None:
                continue
            try:
                yield client_id, decode(stored)
            except ConfigurationError as exc:
                yield client_id, exc
