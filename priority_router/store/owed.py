"""Documents' ends a process could not send while the counter store failed (``mode="inflight"``,
and the gate's), kept to be sent once it answers.

Without them a busy client's count would stay wrong: publishes go on counting its
documents and re-arming its idle reset, while the ends dropped during a stall of the store
(one slow reply is enough to open the breaker) would never come back.  Sending an end
again is safe: an end removes one entry of its document at most once, so an end whose
reply was lost, sent again, changes nothing.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from ..forks import renew_after_fork

#: The most ends one process keeps; past it the oldest are forgotten (the idle reset then
#: clears what they would have ended).
MAX_OWED = 100_000

#: One owed end: the client, the document's task id, the cost units its headers gave (None: none).
End = tuple[str, str, int | None]
E = TypeVar("E")


class OwedEnds(Generic[E]):
    """A bounded queue of owed ends and the one daemon thread that sends them again."""

    def __init__(self, limit: int = MAX_OWED) -> None:
        #: Bounded: appending past ``limit`` forgets the oldest, giving back past it the newest.
        self._ends: deque[E] = deque(maxlen=limit)
        self._lock = threading.Lock()
        self._retrier: threading.Thread | None = None
        #: How the retrier sends, once one was asked for: ends given back start it again.
        self._sending: tuple[float, Callable[[], object]] | None = None
        renew_after_fork(self)

    def after_fork(self) -> None:
        # A forked child (a prefork pool process) has no retrier thread, and a lock the
        # parent's retrier held at the fork would never be released in it.
        self._lock = threading.Lock()
        self._retrier = None

    def __len__(self) -> int:
        return len(self._ends)

    def add(self, end: E) -> bool:
        """Keep ``end``; False when the oldest one was forgotten to make room."""
        with self._lock:
            full = len(self._ends) == self._ends.maxlen
            self._ends.append(end)
            return not full

    def take(self, n: int) -> list[E]:
        """The ``n`` oldest owed ends, no longer kept."""
        with self._lock:
            return [self._ends.popleft() for _ in range(min(n, len(self._ends)))]

    def give_back(self, ends: list[E]) -> None:
        """Ends taken but not sent: kept again, oldest first."""
        with self._lock:
            self._ends.extendleft(reversed(ends))
            # The retrier may have found nothing owed while these were out, and stopped.
            if self._ends and self._retrier is None and self._sending is not None:
                self._start(*self._sending)

    def retry_every(self, seconds: float, send: Callable[[], object]) -> None:
        """Call ``send()`` every ``seconds`` from a daemon thread until nothing is owed; a
        thread already doing so is enough."""
        with self._lock:
            self._sending = (seconds, send)
            if self._retrier is None:
                self._start(seconds, send)

    def _start(self, seconds: float, send: Callable[[], object]) -> None:
        self._retrier = threading.Thread(
            target=self._retry, args=(seconds, send), name="priority-router-owed-ends", daemon=True
        )
        self._retrier.start()

    def _retry(self, seconds: float, send: Callable[[], object]) -> None:
        while True:
            time.sleep(seconds)
            send()
            with self._lock:
                if not self._ends:
                    self._retrier = None  # under the lock: an add from now on starts another
                    return
