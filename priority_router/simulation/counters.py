"""The router's per-client counts, in memory, with the semantics of the Redis stores.

The priority table is imported (:class:`~priority_router.thresholds.Policy`); the reset is not
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
  Redis drops a list whose last entry goes.  A document is checked at no less than the
  count its client's newest document still in flight was checked at, so that a client's
  documents keep their order (``publish_inflight.lua``), unless that document was published
  more than ``reset_interval`` seconds before (the order key's TTL, which only a publish arms).

Redis counts TTLs in whole milliseconds; these compare seconds, so the two can differ only
for a gap within a millisecond of ``reset_interval``.

Both count in whatever whole unit they are given per document: 1 by default (the count in
documents, as the stores answer without costs), or the document's cost in the router's
units (``costs.py``, ``one`` units per cost 1).  A document is checked at the count
before it, so a spell's first document is checked at 0 however much it costs, and an end
gives back what its publish counted.
"""

from __future__ import annotations

from collections.abc import Hashable


class _Count:
    """What both counts share: a client's state, which lapses ``reset_interval`` seconds
    after it was last armed (its second entry), and the read of its units (its first)."""

    def __init__(self, reset_interval: float, one: int = 1) -> None:
        self.reset_interval = reset_interval
        self.one = one
        self._state: dict[Hashable, list[float]] = {}

    def pending(self, client: Hashable, now: float) -> int:
        """The count a read at ``now`` shows, without counting: ``one`` - the units counted
        (1 - documents), never above 0 (the last document is taken to cost ``one``, or all
        that is counted when less), 0 when reset or with nothing counted."""
        state = self._state.get(client)
        if state is None or now - state[1] > self.reset_interval:
            return 0
        return -max(0, int(state[0]) - self.one)


class SeedCount(_Count):
    """What each client submitted in its busy spell (``mode="seed"``); its state per
    client: [units counted in the spell, time of the last check]."""

    def record(self, client: Hashable, now: float, units: int = 1) -> int:
        """One counted submission of ``units`` at ``now``; the pending count it is checked
        at: minus what the spell counted before it (0, -1, -2, ... with units of 1)."""
        state = self._state.get(client)
        if state is None or now - state[1] > self.reset_interval:
            self._state[client] = [units, now]
            return 0
        before = int(state[0])
        state[0] = before + units
        state[1] = now
        return -before


class InflightCount(_Count):
    """What each client published and did not finish yet (``mode="inflight"``); its state
    per client: [units in its list, time the TTL was last armed, which list]."""

    def __init__(self, reset_interval: float, one: int = 1) -> None:
        super().__init__(reset_interval, one)
        #: document -> the list it was pushed onto, until it ends
        self._list_of: dict[Hashable, float] = {}
        self._lists = 0
        #: client -> (its newest document, the units it was checked at, when): the order key,
        #: whose TTL only a publish arms
        self._newest: dict[Hashable, tuple[Hashable, int, float]] = {}

    def record(self, client: Hashable, document: Hashable, now: float, units: int = 1) -> int:
        """The counted publish of ``document``, ``units`` of it, at ``now``; the pending
        count it is checked at: minus what is in flight before it, or minus what its
        client's newest document still in flight was checked at, whichever is lower."""
        state = self._state.get(client)
        if state is None or now - state[1] > self.reset_interval:
            self._lists += 1
            state = self._state[client] = [0, now, self._lists]
        before = int(state[0])
        newest = self._newest.get(client)
        if (
            newest is not None
            and self._list_of.get(newest[0]) == state[2]
            and now - newest[2] <= self.reset_interval
        ):
            before = max(before, newest[1])
        state[0] += units
        state[1] = now
        self._list_of[document] = state[2]
        if before:
            self._newest[client] = (document, before, now)
        return -before

    def end(self, client: Hashable, document: Hashable, now: float, units: int = 1) -> bool:
        """The end of ``document`` (``units``: as its publish counted it) at ``now``; True
        when it was still counted."""
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
        state[0] -= units
        if not state[0]:
            del self._state[client]  # Redis deletes a list whose last entry goes
        return True
