"""A Redis user refused a command (ACL ``NOPERM``): the refused command is named, inside
the router's scripts too, and the breaker takes it for a configuration error said once,
never for an outage; the gate's start-up check runs every command its script uses."""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

import pytest
import redis

from priority_router.store.breaker import CircuitBreaker
from priority_router.store.permissions import acl_user, refusal, register_script

GATE_LUA = Path(__file__).resolve().parents[2] / "priority_router" / "store" / "lua" / "gate.lua"
CALLED = re.compile(r"redis\.call\('([A-Z]+)'")


def test_the_gates_check_runs_every_command_its_script_uses() -> None:
    text = GATE_LUA.read_text()
    check = text.split("if mode == 'check' then", 1)[1].split("\nend\n", 1)[0]
    assert set(CALLED.findall(check)) == set(CALLED.findall(text))


def test_a_refused_command_is_named_plainly_and_inside_a_script() -> None:
    plain = refusal(
        redis.exceptions.NoPermissionError("this user has no permissions to run the 'info' command")
    )
    assert plain is not None and (plain.command, plain.keys) == ("info", False)
    assert plain.fix("svc", "pr:").startswith("ACL SETUSER svc +info")
    source = "local a = 1\nreturn redis.call('ZREM', KEYS[1], 'x')\n"
    register_script(redis.Redis(), source)  # registering connects to nothing
    sha = hashlib.sha1(source.encode()).hexdigest()
    said = (
        f"The user executing the script can't run this command or subcommand script: {sha}, on @user_script:2"
    )
    inside = refusal(redis.ResponseError(said))
    assert inside is not None and inside.command == "zrem"
    unknown = refusal(redis.ResponseError(said.replace(sha, "0" * 40)))
    assert unknown is not None and unknown.command is None and "+<the command>" in unknown.fix(None, "p:")
    keys = refusal(
        redis.exceptions.NoPermissionError(
            "this user has no permissions to access one of the keys used as arguments"
        )
    )
    assert keys is not None and keys.keys and "'~pr:*'" in keys.fix("svc", "pr:")
    assert refusal(redis.ResponseError("WRONGTYPE Operation against a key")) is None
    assert refusal(redis.ConnectionError("refused")) is None


def test_the_user_is_read_from_the_url() -> None:
    assert acl_user("rediss://svc%2Da:pw@h:6380/0?ssl_ca_certs=/ca.pem") == "svc-a"
    assert acl_user("redis://:pw@h/0") is None
    assert acl_user("redis+sentinel://svc:pw@h1:26379,h2:26379/mymaster") == "svc"


def test_a_refusal_is_one_error_per_command_and_no_outage(caplog: pytest.LogCaptureFixture) -> None:
    breaker = CircuitBreaker(1.0, "the priority counter", probe=lambda: None, user="svc", prefix="pr:")
    exists = redis.exceptions.NoPermissionError("this user has no permissions to run the 'exists' command")
    with caplog.at_level(logging.INFO, logger="priority_router"):
        for _ in range(3):
            breaker.failure(exists, "publish")
        breaker.failure(
            redis.exceptions.NoPermissionError("this user has no permissions to run the 'get' command")
        )
    assert not breaker.is_open and breaker.allow("publish")
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in said] == [logging.ERROR, logging.ERROR], said
    assert "refuses the EXISTS command" in said[0][1] and "ACL SETUSER svc +exists" in said[0][1]


def test_a_probe_refused_its_ping_finds_the_store_answering(caplog: pytest.LogCaptureFixture) -> None:
    def ping() -> None:
        raise redis.exceptions.NoPermissionError("this user has no permissions to run the 'ping' command")

    breaker = CircuitBreaker(60.0, "the priority counter", probe=ping, user="svc")
    breaker.failure(redis.ConnectionError("refused"), "publish")
    assert breaker.is_open and not breaker.allow("publish")
    with caplog.at_level(logging.ERROR, logger="priority_router"):
        assert breaker.probe_once()  # it answered, refusing the PING: not an outage
    assert breaker.allow("publish")
    assert "ACL SETUSER svc +ping" in caplog.text
