"""Leaving a developer's Redis as the tests found it.

The tests use three databases of whatever Redis answers (``TEST_DATABASES``).  A session
notes the key names there when it starts and at its end deletes every key that was not
there: keys the developer had are never touched (no FLUSHDB).  Workers are stopped by
the tests that start them, so nothing writes after the sweep.

Two sessions on the same databases (two checkouts, or a second terminal) would delete
each other's keys mid-run, so each one announces itself with a key; one that ends while
another runs deletes nothing and lists its keys for the last one to delete instead.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable

import redis

from workers.local_redis import RedisDatabases

#: One key per running session, in the counter database: ``SESSIONS + host:pid:id``.
SESSIONS = "priority-router-tests:session:"
#: A set of ``b"<db> <key>"``: keys a session left to the one that ends last.
LEFTOVERS = "priority-router-tests:leftovers"
#: How long a session on another host counts as running (a crashed one's key expires).
SESSION_TTL = 6 * 3600


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class KeySweep:
    def __init__(self, databases: RedisDatabases) -> None:
        self.clients = {db: redis.Redis.from_url(databases.url(db)) for db in databases.numbers}
        self.counter_db = databases.first
        self.counter = self.clients[databases.first]
        self.host = socket.gethostname()
        self.marker = f"{SESSIONS}{self.host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.before: dict[int, set[bytes]] = {}

    def start(self) -> None:
        self.before = {db: set(client.scan_iter(count=1000)) for db, client in self.clients.items()}
        self.counter.set(self.marker, b"", ex=SESSION_TTL)

    def finish(self) -> str:
        """Delete the keys this session (and any that left theirs to it) created; says what it did."""
        self.counter.delete(self.marker)
        created = {
            db: {key for key in client.scan_iter(count=1000) if key not in self.before[db]}
            for db, client in self.clients.items()
        }
        created[self.counter_db].discard(LEFTOVERS.encode())
        total = sum(len(keys) for keys in created.values())
        others = self._other_sessions()
        if others:
            members = [f"{db} ".encode() + key for db, keys in created.items() for key in keys]
            for chunk in _chunks(members):
                self.counter.sadd(LEFTOVERS, *chunk)
            return (
                f"{total} keys the tests created in Redis databases {self._names()} are left to "
                f"another test session still running ({', '.join(others)}), which deletes them when it ends"
            )
        taken = []
        for member in self.counter.smembers(LEFTOVERS):
            db, _, key = member.partition(b" ")
            if db.isdigit() and int(db) in created:
                created[int(db)].add(key)
                taken.append(member)
        for chunk in _chunks(taken):
            self.counter.srem(LEFTOVERS, *chunk)
        left = len(taken)
        removed = sum(self._delete(self.clients[db], keys) for db, keys in created.items())
        by_db = ", ".join(f"{len(keys)} in db {db}" for db, keys in created.items())
        extra = f" (with {left} an earlier session left)" if left else ""
        return f"removed {removed} keys the tests created in Redis ({by_db}){extra}; older keys are kept"

    def _other_sessions(self) -> list[str]:
        others = []
        for raw in self.counter.scan_iter(match=SESSIONS + "*", count=1000):
            name = raw.decode(errors="replace")[len(SESSIONS) :]
            host, _, rest = name.partition(":")
            pid = rest.partition(":")[0]
            if host == self.host and pid.isdigit() and not _alive(int(pid)):
                self.counter.delete(raw)  # a session here that crashed
                continue
            others.append(f"pid {pid} on {host}")
        return others

    def _names(self) -> str:
        return ", ".join(map(str, self.clients))

    @staticmethod
    def _delete(client: redis.Redis, keys: Iterable[bytes]) -> int:
        return sum(int(client.unlink(*chunk)) for chunk in _chunks(keys))


def delete_prefixed(client: redis.Redis, prefix: str) -> None:
    """Delete the keys under ``prefix`` (one test's ``key_prefix``); the sweep catches the rest."""
    keys = list(client.scan_iter(match=prefix + "*", count=1000))
    for chunk in _chunks(keys):
        client.unlink(*chunk)


def _chunks(items: Iterable[bytes], size: int = 500) -> Iterable[list[bytes]]:
    chunk: list[bytes] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
