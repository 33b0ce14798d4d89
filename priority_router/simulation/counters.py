"""The router's per-client counts, in memory, with the semantics of the Redis stores.

The priority table is imported (:class:`~priority_router.policy.Policy`); the reset is not
code but Redis TTL behaviour, so it is restated here and checked against the real stores
(``tests/unit/test_simulation_counters.py`` runs one random sequence through both):

- :class:`SeedCount` is :class:`~priority_router.store.counter.Counter`: a check is
  ``INCR`` then ``PEXPIRE reset_interval``, so the count restarts when the client's last
  check was more than ``reset_interval`` seconds ago (Redis keeps a key while
  ``now <= expiry``).
- :class:`InflightCount` is :class:`~priority_router.store.inflight.InflightCounter`: a
  publish is ``LPUSH`` then ``PEXPIRE``, an end ``LREM`` then ``PEXPIRE``.  An end re-arms
  the list's TTL even when its document is not in the list (the list expired and was
  started again since), an end after the list expired or emptied changes nothing, and
  Redis drops a list whose last entry goes.

Redis counts TTLs in whole milliseconds; these compare seconds, so the two can differ only
for a gap within a millisecond of ``reset_interval``.
"""

from __future__ import annotations

from collections.abc import Hashable


class SeedCount:
    """Documents submitted in each client's busy spell (``mode="seed"``)."""

    def __init__(self, reset_interval: float) -> None:
        self.reset_interval = reset_interval
        #: client -> [documents in the spell, time of the last check]
        self._state: dict[Hashable, list[float]] = {}

    def check(self, client: Hashable, now: float) -> int:
        """One counted submission at ``now``; the new pending count (0, -1, -2, ...)."""
        state = self._state.get(client)
        if state is None or now - state[1] > self.reset_interval:
            self._state[client] = [1, now]
            return 0
        state[0] += 1
        state[1] = now
        return 1 - int(state[0])

    def pending(self, client: Hashable, now: float) -> int:
        """The count a read at ``now`` shows, without counting (0 when reset)."""
        state = self._state.get(client)
        if state is None or now - state[1] > self.reset_interval:
            return 0
        return 1 - int(state[0])


class InflightCount:
    """Documents published and not yet finished, per client (``mode="inflight"``)."""

    def __init__(self, reset_interval: float) -> None:
        self.reset_interval = reset_interval
        #: client -> [documents in its list, time the TTL was last armed, which list]
        self._state: dict[Hashable, list[float]] = {}
        #: document -> the list it was pushed onto, until it ends
        self._list_of: dict[Hashable, float] = {}
        self._lists = 0

    def check(self, client: Hashable, document: Hashable, now: float) -> int:
        """The counted publish of ``document`` at ``now``; the new pending count."""
        state = self._state.get(client)
        if state is None or now - state[1] > self.reset_interval:
            self._lists += 1
            state = self._state[client] = [0, now, self._lists]
        state[0] += 1
        state[1] = now
        self._list_of[document] = state[2]
        return 1 - int(state[0])

    def end(self, client: Hashable, document: Hashable, now: float) -> bool:
        """The end of ``document`` at ``now``; True when it was still counted."""
        pushed_onto = self._list_of.pop(document, None)
        state = self._state.get(client)
        if state is None:
            return False
        if now - state[1] > self.reset_interval:
            del self._state[client]  # expired: LREM finds no list and PEXPIRE arms nothing
            return False
        state[1] = now
        if pushed_onto != state[2]:
            return False
        state[0] -= 1
        if not state[0]:
            del self._state[client]  # Redis deletes a list whose last entry goes
        return True

    def pending(self, client: Hashable, now: float) -> int:
        """The count a read at ``now`` shows: 1 - in flight, 0 with nothing in flight."""
        state = self._state.get(client)
        if state is None or now - state[1] > self.reset_interval:
            return 0
        return 1 - int(state[0])
