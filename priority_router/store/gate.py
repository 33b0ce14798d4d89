"""The gate's state in the counter store: per client, the documents running and the ones
held by the client's limits (docs/caps.md says why each step is safe to be killed at).

Per client, four keys under its hash tag (``keys.GATE_SUFFIXES``), changed only by
``lua/gate.lua``, atomically: the running documents with their leases, the held ones in
order, the held ones' messages, and the rate's tokens and the running units of cost.  One
key across clients, ``<prefix>held-clients``, says which clients hold documents and when a
worker should look at each again (a rate's next token, else a few seconds on); it is
written after the client's script, so it may name a client with nothing held (a sweep then
removes it, only if nobody wrote it in between: ``lua/gate_index.lua``), never miss one
that holds documents for longer than a crash between the two writes, which a redelivery
repairs (the message was not acknowledged yet).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from ..limits import Limits
from .client_ids import gate_keys, held_index_key
from .costs import ONE

_LUA = Path(__file__).parent / "lua"

#: Seconds a running document keeps its slot without its worker renewing the lease.
DEFAULT_LEASE = 30.0
#: Seconds before a worker looks again at a client held by its cap (ends release sooner).
RECHECK = 2.0
#: Most documents one call releases.
RELEASE_BATCH = 100


@dataclass(frozen=True)
class Verdict:
    """What the gate said of one document, and what it released."""

    #: "run", "held", "duplicate" (a held document delivered again) or "ended".
    outcome: str
    #: What holds the client's oldest held document now: "cap" or "rate"; with nothing
    #: held, "lease" while documents run, else "none".
    state: str
    #: When the rate's next token is due, or the first lease runs out (Unix ms); else 0.
    due_ms: int
    #: Documents released: (task id, stored message), to publish again and then forget.
    released: list[tuple[str, bytes]] = field(default_factory=list)


_OUTCOMES = {1: "run", 0: "held", 2: "duplicate", -1: "ended"}


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
    return (
        f"{sum(s.held for s in held.values())} document(s) are held by caps in the counter store, of {shown}"
    )


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
        message: bytes,
        now_ms: int | None = None,
    ) -> Verdict:
        """A received document of ``client_id``: run it, or hold it (storing ``message``)."""
        return self._call(client_id, "admit", task_id, limits, 0, now_ms, [units, message])

    def end(
        self,
        client_id: str,
        task_id: str,
        limits: Limits,
        borrow: int = 0,
        now_ms: int | None = None,
    ) -> Verdict:
        """The end of a gated document (``task_id`` "" for a sweep): its slot is free, and
        held documents the limits now allow are released; ``borrow`` of them may pass the
        caps (the caller saw idle slots and nothing else waiting)."""
        return self._call(client_id, "end", task_id, limits, borrow, now_ms, [])

    def forget(self, client_id: str, task_id: str) -> None:
        """A released document is in the broker again: drop its stored message."""
        self._redis.hdel(gate_keys(self._prefix, client_id)[2], task_id)

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

    def read(self, client_id: str, now_ms: int | None = None) -> GateState:
        run, held, _, gate = gate_keys(self._prefix, client_id)
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
            script = self._scripts[name] = self._redis.register_script((_LUA / f"{name}.lua").read_text())
        return script

    def _next_look(self, verdict: Verdict, now_ms: int | None) -> int:
        if verdict.state in ("rate", "lease") and verdict.due_ms:
            return verdict.due_ms
        return _now_ms(now_ms) + round(RECHECK * 1000)

    def _call(
        self,
        client_id: str,
        mode: str,
        task_id: str,
        limits: Limits,
        borrow: int,
        now_ms: int | None,
        tail: list[object],
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
            RELEASE_BATCH,
            *tail,
        ]
        reply = self._script("gate")(keys=gate_keys(self._prefix, client_id), args=args)
        verdict, state, due = reply[0], _text(reply[1]), int(reply[2])
        pairs = reply[3:]
        released = [(_text(pairs[i]), _bytes(pairs[i + 1])) for i in range(0, len(pairs), 2)]
        return Verdict(_OUTCOMES[int(verdict)], state, due, released)


def _now_ms(now_ms: int | None) -> int:
    return int(time.time() * 1000) if now_ms is None else now_ms


def _text(value: object) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else str(value)


def _bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()
