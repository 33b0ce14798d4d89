"""The gate's counts in the counter store: per client, the documents running (with their
leases) and how many are held by the client's limits (docs/caps.md says why each step is
safe to be killed at).  The store only counts: a held document's message waits in the
broker, in its client's holding queue (``integration/holding.py``), so a store restarted
empty, failed over or evicted loses counts, never a document.

Per client, three keys under its hash tag (``client_ids.GATE_SUFFIXES``), changed only by
``lua/gate.lua``, atomically: the running documents with their leases, the ids of the held
ones in order, and the rate's tokens and the running units of cost.  One key across
clients, ``<prefix>held-clients``, says which clients hold documents and when a worker
should look at each again (a rate's next token, else a few seconds on); it is written after
the client's script, so it may name a client with nothing held (a sweep then removes it,
only if nobody wrote it in between: ``lua/gate_index.lua``).  What it misses (a crash
between the two writes, a store that lost it) the workers find again from the broker's own
index of holding queues.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import redis

from ..limits import Limits
from .client_ids import gate_keys, held_index_key
from .costs import ONE
from .permissions import register_script

_LUA = Path(__file__).parent / "lua"

#: Seconds a running document keeps its slot without its worker renewing the lease.
DEFAULT_LEASE = 30.0
#: Seconds before a worker looks again at a client held by its cap (ends release sooner).
RECHECK = 2.0
#: The client whose keys :meth:`GateStore.check` runs the gate's commands on (no client id
#: starts with a space, so no document has it; the check leaves none of its keys behind).
CHECK_CLIENT = " priority-router check"
#: Most documents one end or sweep releases.
RELEASE_BATCH = 100


@dataclass(frozen=True)
class Verdict:
    """What the gate said of one document, and what the client's held ones wait for."""

    #: admit: "run", "held" or "duplicate" (a held document delivered again); take: "run",
    #: "borrowed" (run beyond the caps) or "blocked"; else "ended".
    outcome: str
    #: What the client's next held document waits for: "cap" or "rate"; "free" when one may
    #: start now; with nothing held, "lease" while documents run, else "none".
    state: str
    #: When the rate's next token is due, or the first lease runs out (Unix ms); else 0.
    due_ms: int
    #: How many documents the store counts held for the client.
    held: int = 0
    #: After an end: how many more may start beyond the caps (borrowing).
    borrow: int = 0


_OUTCOMES = {1: "run", 0: "held", 2: "duplicate", -1: "ended", 3: "blocked", 4: "borrowed"}

#: Milliseconds a published release is remembered by default: longer than a kombu Redis
#: broker's default ``visibility_timeout`` (3600 s), after which a held copy taken by a
#: killed releaser comes back to its holding queue (RabbitMQ: at once).
REMEMBER_SENT_MS = 3_900_000

#: Milliseconds after which a held count whose message is not in the holding queue is
#: stale: a hold publishes its message within a few milliseconds of being counted.
STALE_HELD_MS = 10_000


@dataclass(frozen=True)
class GateState:
    """One client's gate as ``status`` and ``inspect`` show it."""

    #: Documents running (or released and on their way back), leases not run out.
    running: int
    held: int
    running_units: int
    #: When the oldest held document was held (Unix ms), None when none is.
    oldest_held_ms: int | None = None


def held_by(state: GateState, limits: Limits) -> str | None:
    """What holds a client's held documents now: "cap", "rate", or None when none is held."""
    if not state.held:
        return None
    cap, cost = limits.max_in_flight, limits.max_cost_in_flight
    if (cap is not None and state.running >= cap) or (cost is not None and state.running_units >= cost * ONE):
        return "cap"
    return "rate" if limits.rate is not None else "cap"


def describe_held(held: Mapping[str, GateState]) -> str:
    """``held`` (:meth:`GateStore.held_now`) in words, the first ten clients named."""
    shown = ", ".join(f"{client!r} ({state.held})" for client, state in sorted(held.items())[:10])
    return f"{sum(s.held for s in held.values())} document(s) are held by caps, of {shown}"


class HeldDocument(Protocol):
    """A held document taken from where it waits (the broker's holding queue), not yet gone
    from there."""

    task_id: str
    units: int

    def send(self) -> None:
        """Send it to run."""

    def drop(self) -> None:
        """Let go of the held copy (it was sent)."""

    def put_back(self) -> None:
        """Leave it held, first in line."""


class HeldDocuments(Protocol):
    """Where one client's held documents wait, oldest first."""

    def take(self) -> HeldDocument | None:
        """The oldest, or None when none waits."""


class GateStore:
    """The gate's calls on one Redis (or Redis Cluster) connection."""

    def __init__(self, client: redis.Redis, prefix: str, lease: float = DEFAULT_LEASE) -> None:
        self._redis = client
        self._prefix = prefix
        self.lease_ms = max(1000, round(lease * 1000))
        self._index = held_index_key(prefix)
        # Registered on first use: on Redis Cluster, registering a script connects.
        self._scripts: dict[str, Any] = {}

    def admit(
        self,
        client_id: str,
        task_id: str,
        limits: Limits,
        units: int,
        now_ms: int | None = None,
    ) -> Verdict:
        """A received document of ``client_id``: run it, or count it held (its message then
        goes to the client's holding queue)."""
        return self._call(client_id, "admit", task_id, limits, 0, now_ms, units)

    def end(
        self,
        client_id: str,
        task_id: str,
        limits: Limits,
        borrow: int = 0,
        now_ms: int | None = None,
    ) -> Verdict:
        """The end of a gated document (``task_id`` "" for a sweep): its slot is free; the
        verdict's state says whether a held document may start ("free"), and its ``borrow``
        how many of ``borrow`` may pass the caps (the caller saw idle slots and nothing else
        waiting)."""
        return self._call(client_id, "end", task_id, limits, borrow, now_ms, 0)

    def sent(self, client_id: str, task_id: str, remember_ms: int, now_ms: int | None = None) -> None:
        """A released document is published again: a copy of it that comes back to the holding
        queue within ``remember_ms`` (its releaser killed before letting go of it) is dropped."""
        self._call(client_id, "sent", task_id, Limits(), 0, now_ms, remember_ms)

    def take(
        self,
        client_id: str,
        task_id: str,
        limits: Limits,
        units: int,
        borrow: bool = False,
        now_ms: int | None = None,
    ) -> Verdict:
        """A held document taken from the holding queue: "run" (its slot reserved until it
        arrives back), "borrowed" (beyond the caps, ``borrow`` allowing), "blocked", or
        "duplicate" (a copy of one already sent: drop it)."""
        return self._call(client_id, "take", task_id, limits, int(borrow), now_ms, units)

    def release(
        self,
        client_id: str,
        limits: Limits,
        verdict: Verdict,
        held: HeldDocuments,
        remember_ms: int,
        most: int = RELEASE_BATCH,
        now_ms: int | None = None,
    ) -> tuple[list[str], Verdict]:
        """Release ``client_id``'s held documents, oldest first, while its limits allow
        (``verdict``: the store's last word on the client, whose ``borrow`` may pass the
        caps); the task ids released, and the store's word after them.  A document whose
        release raises gets its slot back, and the error is raised."""
        borrow = verdict.borrow
        released: list[str] = []
        while len(released) < most and (verdict.state == "free" or (verdict.state == "cap" and borrow > 0)):
            document = held.take()
            if document is None:
                verdict = self.clear(client_id, limits, now_ms)
                break
            try:
                verdict = self.take(client_id, document.task_id, limits, document.units, borrow > 0, now_ms)
            except BaseException:
                document.put_back()
                raise
            if verdict.outcome == "blocked":
                document.put_back()
                break
            if verdict.outcome == "duplicate":
                document.drop()
                continue
            try:
                document.send()
            except BaseException:
                self.end(client_id, document.task_id, limits, now_ms=now_ms)
                raise
            try:
                # Said before the held copy goes: a kill in between leaves a copy the next take
                # drops.  Sent is sent: the copy goes even when the store cannot hear it.
                self.sent(client_id, document.task_id, remember_ms, now_ms)
            finally:
                document.drop()
            if verdict.outcome == "borrowed":
                borrow -= 1
            released.append(document.task_id)
        return released, verdict

    def mark(self, client_id: str, queued: int, limits: Limits, now_ms: int | None = None) -> Verdict:
        """The client's holding queue has ``queued`` documents: count at least as many held
        (after the store lost its keys)."""
        return self._call(client_id, "mark", "", limits, 0, now_ms, queued)

    def clear(self, client_id: str, limits: Limits, now_ms: int | None = None) -> Verdict:
        """The client's holding queue was found empty: drop held counts older than
        :data:`STALE_HELD_MS` (left by releasers that died)."""
        return self._call(client_id, "clear", "", limits, 0, now_ms, STALE_HELD_MS)

    def renew(self, running: Mapping[str, Iterable[str]], now_ms: int | None = None) -> None:
        """Extend the leases of the documents this worker runs (client -> task ids)."""
        deadline = _now_ms(now_ms) + self.lease_ms
        with self._redis.pipeline(transaction=False) as pipe:
            for client_id, task_ids in running.items():
                run = gate_keys(self._prefix, client_id)[0]
                pipe.zadd(run, dict.fromkeys(task_ids, deadline), xx=True)
                pipe.pexpire(run, 2 * self.lease_ms)
            pipe.execute()

    def note_held(self, client_id: str, verdict: Verdict, now_ms: int | None = None) -> None:
        """Index a client that holds documents, for the workers' sweeps (the earliest look wins)."""
        if verdict.state == "none":
            return
        self._redis.zadd(self._index, {client_id: self._next_look(verdict, now_ms)}, lt=True)

    def due(self, now_ms: int | None = None, count: int = 50) -> list[tuple[str, float]]:
        """Clients a sweep should look at now, with the score it saw."""
        found: list[Any] = self._redis.zrangebyscore(
            self._index, "-inf", _now_ms(now_ms), 0, count, withscores=True
        )
        return [(_text(pair[0]), float(pair[1])) for pair in found]

    def holding(self, count: int = 200) -> list[str]:
        """Clients the index says hold documents (some may have just been released)."""
        return [_text(member) for member in self._redis.zrange(self._index, 0, count - 1)]

    def held_now(self, count: int = 200) -> dict[str, GateState]:
        """The clients holding documents now, with their state (the index may still name a
        client whose documents were just released: it is left out)."""
        states = {client: self.read(client) for client in self.holding(count)}
        return {client: state for client, state in states.items() if state.held}

    def swept(self, client_id: str, seen: float, verdict: Verdict, now_ms: int | None = None) -> None:
        """After a sweep of ``client_id``: its next look, or off the index when nothing is held
        (unless another worker indexed it since the sweep read ``seen``)."""
        if verdict.state == "none":
            self._script("gate_index")(keys=[self._index], args=[client_id, repr(seen)])
        else:
            self._redis.zadd(self._index, {client_id: self._next_look(verdict, now_ms)})

    def check(self) -> bool:
        """Run every command the gate uses, changing nothing (on the keys of a client no
        document has, and the index); True, or raises what the store raises, e.g. the
        ``NOPERM`` of a Redis user refused one (``permissions.py``)."""
        keys = gate_keys(self._prefix, CHECK_CLIENT)
        self._script("gate")(keys=keys, args=["check", "check", 0, self.lease_ms, -1, -1, 0, 0, 0, 0])
        run, held, _, _ = keys
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.zadd(self._index, {CHECK_CLIENT: 0}, xx=True)
            pipe.zrangebyscore(self._index, "-inf", "-inf", 0, 1)
            pipe.zrange(self._index, 0, 0)
            pipe.zscore(self._index, CHECK_CLIENT)
            pipe.zcount(run, "+inf", "+inf")
            pipe.pexpire(run, self.lease_ms)
            pipe.lindex(held, 0)
            pipe.execute()
        return True

    def read(self, client_id: str, now_ms: int | None = None) -> GateState:
        run, held, gate, _ = gate_keys(self._prefix, client_id)
        now = _now_ms(now_ms)
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.zcount(run, f"({now}", "+inf")
            pipe.llen(held)
            pipe.hget(gate, "sum")
            pipe.lindex(held, 0)
            running, held_count, units, oldest = pipe.execute()
        since = self._redis.hget(gate, "at:" + _text(oldest)) if oldest is not None else None
        return GateState(
            int(running), int(held_count), int(units or 0), None if since is None else int(since)
        )

    def _script(self, name: str) -> Any:
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = register_script(self._redis, (_LUA / f"{name}.lua").read_text())
        return script

    def _next_look(self, verdict: Verdict, now_ms: int | None) -> int:
        if verdict.state in ("rate", "lease") and verdict.due_ms:
            return verdict.due_ms
        if verdict.state == "free":
            return _now_ms(now_ms)
        return _now_ms(now_ms) + round(RECHECK * 1000)

    def _call(
        self,
        client_id: str,
        mode: str,
        task_id: str,
        limits: Limits,
        borrow: int,
        now_ms: int | None,
        number: int,
    ) -> Verdict:
        cap = limits.max_in_flight
        cost = limits.max_cost_in_flight
        rate = limits.per_second
        args: list[object] = [
            mode,
            task_id,
            _now_ms(now_ms),
            self.lease_ms,
            -1 if cap is None else cap,
            -1 if cost is None else math.floor(cost * ONE),
            0 if rate is None else repr(rate / 1000),
            limits.bucket or 0,
            borrow,
            number,
        ]
        reply = self._script("gate")(keys=gate_keys(self._prefix, client_id), args=args)
        return Verdict(_OUTCOMES[int(reply[0])], _text(reply[1]), int(reply[2]), int(reply[3]), int(reply[4]))


def _now_ms(now_ms: int | None) -> int:
    return int(time.time() * 1000) if now_ms is None else now_ms


def _text(value: object) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)
