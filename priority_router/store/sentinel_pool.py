"""The connection pool of a counter store reached through Redis Sentinel, which follows a
switch of master within about :data:`ASK_EVERY` seconds.

redis-py asks the Sentinels for the master only when a connection connects, and leaves an
open connection when the server it reaches answers ``READONLY``.  A failover ordered while
the master runs (``SENTINEL FAILOVER``, for maintenance) promotes the replica at once, but
the Sentinels demote the old master only when they next look at it, seconds later; until
then it still takes writes, and the router's open connections kept counting there.  The
demoted master then resynced and dropped them: 533 of 1,013 counts in a test's run, silently
(docs/sentinel.md, "A planned failover").

While the pool is used, a short-lived thread asks the Sentinels at most every
:data:`ASK_EVERY` seconds (never a publish: a check only starts the thread), and a
connection taken from the pool that is open to another server than the master they name
is closed, so that its next command connects to that master.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import redis
from redis.sentinel import SentinelConnectionPool

logger = logging.getLogger("priority_router")

#: Seconds between two questions to the Sentinels while the pool is in use.
ASK_EVERY = 1.0


class FollowingPool(SentinelConnectionPool):
    """A Sentinel master's pool that follows a switch of master (see the module)."""

    def __init__(self, service_name: str, sentinel_manager: Any, **kwargs: Any) -> None:
        super().__init__(service_name, sentinel_manager, **kwargs)  # type: ignore[no-untyped-call]
        self._asked = time.monotonic()  # the first connection asks them anyway

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        now = time.monotonic()
        if now - self._asked >= ASK_EVERY:
            self._asked = now
            asking = threading.Thread(target=self._ask, name="priority-router-sentinel", daemon=True)
            with contextlib.suppress(RuntimeError):  # an interpreter shutting down starts no thread
                asking.start()
        connection = super().get_connection(*args, **kwargs)
        master = self._master()
        if master is not None and (connection.host, connection.port) != tuple(master):
            connection.disconnect()  # type: ignore[no-untyped-call]  # it reconnects to the master named
        return connection

    def _master(self) -> Any:
        """The master the Sentinels last named (redis-py 6.4 and later keep it on the pool's
        ``proxy``); None before the first connection, or on a redis-py that keeps it elsewhere,
        where the pool follows a switch only as redis-py does."""
        return getattr(getattr(self, "proxy", None), "master_address", None)

    def _ask(self) -> None:
        before = self._master()
        try:
            after = self.get_master_address()  # type: ignore[no-untyped-call]  # closes idle ones if it moved
        except (redis.RedisError, OSError):
            return  # no Sentinel answers: the store's own failures say so, through the breaker
        if before is not None and tuple(after) != tuple(before):
            logger.info(
                "priority-router: the Sentinels name %s:%s master of %r (it was %s:%s); the counter "
                "store's connections follow",
                *after,
                self.service_name,
                *before,
            )
