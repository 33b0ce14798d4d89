"""A worker's daemon thread that does one step every few seconds and says, once, when its
steps start failing and when they have worked again for a while (the ``max_wait`` sweeper,
the gate's thread)."""

from __future__ import annotations

import logging
import threading
import time

logger = logging.getLogger("priority_router")


class Periodic:
    """Calls :meth:`step` every ``interval`` seconds on a daemon thread until stopped."""

    #: What the step is, and what goes on without it, for the WARNING of a failure.
    doing = "the step"
    meanwhile = "nothing else changes"
    #: Seconds the steps must keep working before a failing thread says it works again:
    #: a store that takes reads but refuses writes (over ``maxmemory``, unable to evict)
    #: fails every few steps, and is one failure, not a WARNING and an INFO each time.
    steady = 10.0

    def __init__(self, name: str, interval: float) -> None:
        self.interval = interval
        self._stopped = threading.Event()
        self._failing = False
        self._working_since: float | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def step(self) -> bool:
        """One step; whether it reached what it works on (a step with nothing to do says
        False, so that it does not count as the store or broker answering again)."""
        raise NotImplementedError

    def on_failure(self) -> None:
        """Drop what a failed step may have left half open (a connection)."""

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.on_failure()

    def _run(self) -> None:
        while not self._stopped.wait(self.interval):
            try:
                worked = self.step()
            except Exception as exc:
                self.on_failure()
                self._working_since = None
                if not self._failing:
                    logger.warning(
                        "priority-router: %s failed (%s: %s); %s until it works again "
                        "(retrying every %.2f s)",
                        self.doing,
                        type(exc).__name__,
                        exc,
                        self.meanwhile,
                        self.interval,
                    )
                else:
                    logger.debug("%s failed again", self.doing, exc_info=True)
                self._failing = True
                continue
            if self._failing and worked:
                now = time.monotonic()
                self._working_since = self._working_since or now
                if now - self._working_since >= self.steady:
                    # Said once it held, so the log's time is late: name when it came back.
                    logger.info(
                        "priority-router: %s works again (since %.0f s ago)",
                        self.doing,
                        now - self._working_since,
                    )
                    self._failing, self._working_since = False, None
