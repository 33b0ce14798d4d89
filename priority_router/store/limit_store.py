"""Where clients' limits live (``limits.py``): one hash for every client's own limits, one
key for the default limits, and a version number that every change raises.

Workers need every limit at hand when a document arrives, without a round trip per
document, so each process keeps a :class:`Snapshot` and reads the version again at most
every ``refresh`` seconds, the hash itself only when the version moved: a change is in
effect on every worker within ``refresh`` seconds.  Publishers never read limits.

A client's limits follow the tier rule: its own tier's limits when it has a tier of its
own (``set_tier`` stores an empty value for a tier without limits, so such a client is
exempt from the default limits), else the default tier's.  The hash lives in one Redis
Cluster slot; nothing reads it inside a client's transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import redis

from ..errors import ConfigurationError
from ..forks import renew_after_fork
from ..limits import NONE, Limits, decode
from .client_ids import default_limits_key, limits_key, limits_version_key
from .permissions import refusal
from .writes import Writes

logger = logging.getLogger("priority_router")

#: Seconds a process keeps the limits before reading their version again.
LIMITS_REFRESH = 1.0


@dataclass(frozen=True)
class Snapshot:
    """Every client's limits as one process last read them."""

    clients: dict[str, Limits] = field(default_factory=dict)
    default: Limits = NONE

    def of(self, client_id: str) -> Limits:
        return self.clients.get(client_id, self.default)

    def __bool__(self) -> bool:
        return bool(self.default) or any(self.clients.values())

    @property
    def borrowing(self) -> bool:
        """Whether any client may borrow idle slots."""
        return self.default.borrow or any(limits.borrow for limits in self.clients.values())


class LimitStore:
    """Reads and writes limits in the counter store."""

    def __init__(self, client: redis.Redis, prefix: str, refresh: float = LIMITS_REFRESH) -> None:
        self._redis = client
        self._prefix = prefix
        self._hash = limits_key(prefix)
        self._default = default_limits_key(prefix)
        self._version = limits_version_key(prefix)
        self.refresh = refresh
        self._snapshot = Snapshot()
        self._seen: object = None
        self._until = 0.0
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        renew_after_fork(self)

    def after_fork(self) -> None:
        # The parent's gate thread reads the limits under this lock every quarter second.
        self._lock = threading.Lock()

    def set(self, client_id: str, limits: Limits, writes: Writes) -> None:
        """Queue the client's limits in ``writes`` (the tier change's transaction)."""
        writes.hset(self._hash, client_id, limits.encode())
        writes.incr(self._version)

    def unset(self, client_id: str, writes: Writes) -> None:
        writes.hdel(self._hash, client_id)
        writes.incr(self._version)

    def get(self, client_id: str) -> Limits | None:
        """The limits of the client's own tier, None when it has no entry."""
        stored = self._redis.hget(self._hash, client_id)
        return None if stored is None else decode(stored)

    def set_default(self, limits: Limits, writes: Writes) -> None:
        """Queue the default limits (none: their removal; its first reply, whether some
        were stored) and the version's rise."""
        if limits:
            writes.set(self._default, limits.encode())
        else:
            writes.delete(self._default)
        writes.incr(self._version)

    def get_default(self) -> Limits:
        stored = self._redis.get(self._default)
        return NONE if stored is None else decode(stored)

    def all(self) -> dict[str, Limits | ConfigurationError]:
        """Every client's own limits as stored (an unreadable one: why)."""
        found: dict[str, Limits | ConfigurationError] = {}
        for raw, stored in self._redis.hgetall(self._hash).items():
            client = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
            try:
                found[client] = decode(stored)
            except ConfigurationError as exc:
                found[client] = exc
        return found

    def snapshot(self) -> Snapshot:
        """The limits as this process last read them, read again when ``refresh`` seconds have
        passed and the version moved.  Never raises: a failed read keeps what was read."""
        now = time.monotonic()
        if now < self._until:
            return self._snapshot
        with self._lock:
            if now < self._until:
                return self._snapshot
            self._until = now + self.refresh
            try:
                version = self._redis.get(self._version)
                if version is None:
                    # No limit was ever stored under the prefix (setting any raises the version).
                    self._snapshot = Snapshot()
                elif version != self._seen:
                    self._snapshot = self._read()
                self._seen = version
            except redis.RedisError as exc:
                # The gate's own calls fail too, and its breaker says so; but a store that
                # refuses only this read would leave every limit unread, and nobody to say it.
                refused = refusal(exc)
                if refused is not None and "refused" not in self._warned:
                    self._warned.add("refused")
                    logger.error(
                        "priority-router: the counter store refuses %s to its Redis user (%s), so this "
                        "process cannot read the clients' limits and enforces none. Fix: %s",
                        refused.problem(),
                        refused.said,
                        refused.fix(None, self._prefix),
                    )
        return self._snapshot

    def _read(self) -> Snapshot:
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._hash)
            pipe.get(self._default)
            stored, default = pipe.execute()
        clients = {}
        for raw, value in stored.items():
            client = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
            clients[client] = self._decoded(value, f"client {client!r}")
        return Snapshot(clients, NONE if default is None else self._decoded(default, "the default tier"))

    def _decoded(self, stored: bytes | str, whose: str) -> Limits:
        try:
            return decode(stored)
        except ConfigurationError as exc:
            if whose not in self._warned and len(self._warned) < 1000:
                self._warned.add(whose)
                logger.error(
                    "priority-router: the limits of %s are unreadable (%s); its documents are not limited. "
                    "Fix: %s",
                    whose,
                    exc.problem,
                    exc.fix,
                )
            return NONE
