"""A circuit breaker so a failing counter store costs nothing per call, and a store that
answers again is used again within a moment.

Closed, calls go through.  A store error opens it: :meth:`CircuitBreaker.allow` then says
no at once, so no publish waits on a store that does not answer.  Meanwhile a daemon
thread probes the store (``probe``, a ``PING``): 50 ms after the failure, then twice as
long each time, at most ``cooldown`` apart, so a dead store is asked once a second or
less, and a store back after a failover is seen within ``cooldown``.  When a probe
answers, the next caller goes through; its success closes the breaker, its failure opens
it again (for a store that answers a ``PING`` but not the call, e.g. a demoted master).

What a process does meanwhile depends on what it uses the store for (its purposes: a
publisher publishes, a worker's pool process sends documents' ends); each purpose the
process uses during an outage says so in one WARNING, and the end of the outage is one
INFO.  A breaker without ``probe`` lets one call through every ``cooldown`` instead, and
says its one ``meanwhile``.

A store that refuses the router's Redis user a command or key (``NOPERM``,
``permissions.py``) answers: the call fails as any failure does (a publish goes out at the
default priority), but the breaker stays closed, so every other call goes on, and the
refusal is one ERROR per command, naming the ACL rule that lifts it, instead of an outage
that ends at every probe and starts again at the next call.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable

import redis
from redis.exceptions import RedisClusterException

from ..forks import renew_after_fork
from .permissions import Refusal, refusal

logger = logging.getLogger("priority_router")

#: What a failing counter store raises: these open the breaker; anything else is a bug.
STORE_ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, RedisClusterException, OSError)

#: Seconds from a failure to the first probe; each next probe waits twice as long, up to
#: the breaker's ``cooldown``.
FIRST_PROBE = 0.05

#: For each purpose: what the process does while the store fails, and once it answers.
PURPOSES = {
    "publish": (
        "pricing publishes by this process's own counts of its clients (reason 'local')",
        "publishes are counted again",
    ),
    "ends": ("keeping documents' ends to send later", "documents' ends are sent again"),
    "confirms": (
        "keeping the confirms of sent documents to send later",
        "sent documents are confirmed again",
    ),
}


class CircuitBreaker:
    """One counter store's health in one process, shared by every purpose that uses it."""

    def __init__(
        self,
        cooldown: float,
        what: str,
        clock: Callable[[], float] = time.monotonic,
        meanwhile: str = "publishing with the default priority",
        probe: Callable[[], object] | None = None,
        user: str | None = None,
        prefix: str = "",
    ) -> None:
        self._cooldown = cooldown
        self._what = what
        #: What a call without a purpose does while the store fails.
        self._meanwhile = meanwhile
        self._probe = probe
        self._clock = clock
        self._lock = threading.Lock()
        #: None while closed; else when the next call may go through (``inf``: when a probe
        #: has answered).
        self._next_call: float | None = None
        self._outage_started = 0.0
        self._probe_delay = FIRST_PROBE
        #: The purposes that said what they do during this outage.
        self._said: set[str] = set()
        #: The probing thread and the process it runs in (a forked child has none).
        self._prober: threading.Thread | None = None
        self._prober_pid = 0
        #: The Redis user and key prefix a refusal's fix names; the refusals already said.
        self._user, self._prefix = user, prefix
        self._refused: set[tuple[str | None, bool]] = set()
        renew_after_fork(self)

    def after_fork(self) -> None:
        """A prefork pool forks while the parent's prober may hold this lock: the child would
        wait on it for good in its first publish.  Its lock starts free, its prober on its own."""
        self._lock = threading.Lock()
        self._prober = None

    @property
    def is_open(self) -> bool:
        return self._next_call is not None

    def allow(self, purpose: str = "") -> bool:
        """Whether a call for ``purpose`` may use the store now; never waits on it."""
        if self._next_call is None:
            return True
        with self._lock:
            if self._next_call is None:
                return True
            now = self._clock()
            if now >= self._next_call:
                # One caller goes through; should it never report, another after cooldown.
                self._next_call = now + self._cooldown
                return True
            if self._next_call == math.inf:
                self._start_prober()  # this process's own, after a fork
            first = self._first_time(purpose)
            started = self._outage_started
        if first:
            logger.warning(
                "%s is not answering (for %.1f s); %s until it does",
                self._what,
                now - started,
                self._doing(purpose),
            )
        return False

    def success(self) -> None:
        if self._next_call is None:
            return
        with self._lock:
            if self._next_call is None:
                return
            lasted = self._clock() - self._outage_started
            said = [p for p in PURPOSES if p in self._said]
            self._next_call = None
        logger.info(
            "%s is answering again after %.1f s; %s",
            self._what,
            lasted,
            ", ".join(PURPOSES[p][1] for p in said) or "it is used again",
        )

    def failure(self, error: BaseException, purpose: str = "") -> None:
        refused = refusal(error)
        if refused is not None:
            self._say_refused(refused, purpose)
            return
        with self._lock:
            now = self._clock()
            if self._next_call is None:
                self._outage_started = now
                self._probe_delay = FIRST_PROBE
                self._said = set()
            if self._probe is None:
                self._next_call = now + self._cooldown
            else:
                self._next_call = math.inf
                self._start_prober()
            first = self._first_time(purpose)
        if first:
            logger.warning(
                "%s failed (%s: %s); %s until it answers (%s at most every %.1f s)",
                self._what,
                type(error).__name__,
                error,
                self._doing(purpose),
                "asking it again" if self._probe is None else "probing it",
                self._cooldown,
            )

    def probe_once(self) -> bool:
        """Probe the store now: whether it answered (then the next call goes through)."""
        assert self._probe is not None
        try:
            self._probe()
        except STORE_ERRORS as exc:
            refused = refusal(exc)
            if refused is None:
                logger.debug("%s still fails", self._what, exc_info=True)
                return False
            # It answers, refusing the probe's PING: the next call finds out the rest.
            self._say_refused(refused, "")
        with self._lock:
            if self._next_call is not None:
                self._next_call = min(self._next_call, self._clock())
        return True

    def _say_refused(self, refused: Refusal, purpose: str) -> None:
        """One ERROR per refused command (or keys), whatever the purpose."""
        seen = (refused.command, refused.keys)
        with self._lock:
            if seen in self._refused:
                return
            self._refused.add(seen)
        logger.error(
            "priority-router: %s refuses %s to its Redis user (%s): a configuration error, not an "
            "outage; %s for every call that needs it, until the user may. Fix: %s",
            self._what,
            refused.problem(),
            refused.said,
            self._doing(purpose),
            refused.fix(self._user, self._prefix),
        )

    def _doing(self, purpose: str) -> str:
        return PURPOSES[purpose][0] if purpose else self._meanwhile

    def _first_time(self, purpose: str) -> bool:
        if purpose in self._said:
            return False
        self._said.add(purpose)
        return True

    def _start_prober(self) -> None:
        """Under the lock: a probing thread in this process, unless one runs."""
        prober = self._prober
        if prober is not None and self._prober_pid == os.getpid() and prober.is_alive():
            return
        thread = threading.Thread(
            target=_probe_until_answered,
            args=(weakref.ref(self),),
            name="priority-router-probe",
            daemon=True,
        )
        try:
            thread.start()
        except RuntimeError:
            # No new threads (the interpreter is shutting down): a call goes through, as a
            # probe, once every cooldown instead.
            self._next_call = self._clock() + self._cooldown
            self._prober = None
            return
        self._prober, self._prober_pid = thread, os.getpid()

    def _next_probe(self) -> float | None:
        """Seconds until the prober's next probe (growing), or None once it has no work."""
        with self._lock:
            if self._next_call != math.inf:
                return None
            delay = self._probe_delay
            self._probe_delay = min(delay * 2, self._cooldown)
            return delay


def _probe_until_answered(ref: weakref.ref[CircuitBreaker]) -> None:
    """The prober's loop; it holds the breaker only weakly, so a router that is dropped
    (its settings changed) takes its prober with it."""
    while True:
        breaker = ref()
        delay = breaker._next_probe() if breaker is not None else None
        del breaker
        if delay is None:
            return
        time.sleep(delay)
        breaker = ref()
        if breaker is None or breaker._next_call != math.inf:
            return
        try:
            if breaker.probe_once():
                return
        except Exception:
            # A bug, not an outage: said with its traceback; calls then probe the store
            # themselves, once every cooldown.
            logger.exception("priority-router: probing %s failed unexpectedly", breaker._what)
            with breaker._lock:
                if breaker._next_call == math.inf:
                    breaker._next_call = breaker._clock() + breaker._cooldown
            return
        del breaker
