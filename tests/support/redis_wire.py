"""What the router writes on a Redis connection, seen from the tests."""

from __future__ import annotations

import socket

import pytest
import redis
from redis.connection import AbstractConnection


def record_sends(client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> list[list[bytes]]:
    """Every payload written from now on through ``client``'s pool, one entry per write
    (one round trip)."""
    sent: list[list[bytes]] = []
    pool = client.connection_pool
    real = pool.get_connection

    def recording(*args: object, **kwargs: object) -> object:
        connection = real(*args, **kwargs)
        if "send_packed_command" not in vars(connection):
            original = connection.send_packed_command
            monkeypatch.setattr(
                connection,
                "send_packed_command",
                lambda c, *a, **k: (sent.append(list(c)), original(c, *a, **k))[1],
            )
        return connection

    monkeypatch.setattr(pool, "get_connection", recording)
    return sent


def send_cut_before_exec(client: redis.Redis, packed: bytes) -> None:
    """Write a packed ``MULTI ... EXEC`` without its ``EXEC`` on a connection of its own, as a
    publisher that dies mid-send would, and close it."""
    assert packed.startswith(b"*1\r\n$5\r\nMULTI\r\n") and packed.endswith(b"*1\r\n$4\r\nEXEC\r\n")
    where = client.connection_pool.connection_kwargs
    with socket.create_connection((where.get("host", "127.0.0.1"), where.get("port", 6379))) as sock:
        db = str(where.get("db", 0)).encode()
        select = b"*2\r\n$6\r\nSELECT\r\n$%d\r\n%s\r\n" % (len(db), db)
        sock.sendall(select + packed[: packed.rindex(b"*1")])
        sock.recv(4096)


def record_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bytes]]:
    """Every write from now on to any Redis socket of this process, as (the server's port,
    the bytes): one entry per round trip, whichever node of a cluster it goes to."""
    writes: list[tuple[int, bytes]] = []
    real = AbstractConnection.send_packed_command

    def recording(self: AbstractConnection, command: object, check_health: bool = True) -> None:
        payload = command if isinstance(command, bytes) else b"".join(command)
        writes.append((int(self.port), payload))
        real(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", recording)
    return writes
