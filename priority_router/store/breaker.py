"""A circuit breaker so a failing counter store costs nothing per publish."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger("priority_router")


class CircuitBreaker:
    """Closed: calls go through.  After a failure it opens for ``cooldown`` seconds,
    during which :meth:`allow` says no at once; then one caller is let through as a
    probe, and its success closes the breaker again.

    One WARNING is logged when an outage starts and one INFO when it ends.
    """

    def __init__(
        self,
        cooldown: float,
        what: str,
        clock: Callable[[], float] = time.monotonic,
        meanwhile: str = "publishing with the default priority",
    ) -> None:
        self._cooldown = cooldown
        self._what = what
        self._meanwhile = meanwhile
        self._clock = clock
        self._lock = threading.Lock()
        self._open_until: float | None = None
        self._outage_started: float | None = None

    def allow(self) -> bool:
        if self._open_until is None:
            return True
        with self._lock:
            if self._open_until is None:
                return True
            now = self._clock()
            if now < self._open_until:
                return False
            # Let exactly one probe through; others keep failing fast meanwhile.
            self._open_until = now + self._cooldown
            return True

    def success(self) -> None:
        if self._open_until is None:
            return
        with self._lock:
            if self._open_until is None:
                return
            started = self._outage_started or self._clock()
            self._open_until = None
            self._outage_started = None
        logger.info(
            "%s is answering again after %.1f s; priorities are counted again",
            self._what,
            self._clock() - started,
        )

    def failure(self, error: BaseException) -> None:
        with self._lock:
            first = self._open_until is None and self._outage_started is None
            now = self._clock()
            self._open_until = now + self._cooldown
            if first:
                self._outage_started = now
        if first:
            logger.warning(
                "%s failed (%s: %s); %s; asking it again every %.1f s",
                self._what,
                type(error).__name__,
                error,
                self._meanwhile,
                self._cooldown,
            )
