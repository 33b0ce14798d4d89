"""A counter store that refuses the router's Redis user a command or a key (``NOPERM``,
Redis ACLs): a configuration error, not an outage, so it is said once, naming the command
and the ACL rule that fixes it, and never opens the breaker (``breaker.py``), since the
store answers.

Redis names the refused command in a plain ``NOPERM`` reply, but inside a Lua script it
names only the script's SHA and line: the router's scripts are registered here
(:func:`register_script`), so that the line's ``redis.call`` names the command.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis

#: Where the ACL rules every role needs are listed.
ACL_DOCS = "docs/deployment.md, 'A Redis user for the router'"

#: The router's Lua scripts, by SHA1: the source a refusal inside one is read from.
_SCRIPTS: dict[str, str] = {}

_RUN = re.compile(r"to run the '([^']+)' command")
_IN_SCRIPT = re.compile(r"can't (run this command|access at least one of the keys)")
_SHA = re.compile(r"(?:script: |f_)([0-9a-f]{40})")
_LINE = re.compile(r"@user_script: ?(\d+)")
_CALLED = re.compile(r"redis\.p?call\('([A-Za-z|]+)'")


def register_script(client: redis.Redis, source: str) -> Any:
    """``client.register_script(source)``, remembered so that a refusal inside it names
    the command."""
    _SCRIPTS[hashlib.sha1(source.encode()).hexdigest()] = source
    return client.register_script(source)


@dataclass(frozen=True)
class Refusal:
    """What the store refused its user: a command (lower case, as ACL rules name it),
    keys, or Pub/Sub channels; ``said`` is Redis's own words."""

    command: str | None
    keys: bool
    said: str

    def problem(self) -> str:
        if self.keys:
            return "a key under the router's key prefix"
        if self.command is None:
            return "a command of the router's Lua scripts"
        return f"the {self.command.upper()} command"

    def fix(self, user: str | None, prefix: str) -> str:
        """The ACL rule that lifts it, for ``user``, and where the full lines are."""
        if self.keys:
            rule = f"'~{prefix}*'"
        elif self.command is None:
            rule = "+<the command>"
        else:
            rule = f"+{self.command}"
        return f"ACL SETUSER {user or '<user>'} {rule} (every rule each role needs: {ACL_DOCS})"


def refusal(exc: BaseException) -> Refusal | None:
    """What ``exc`` says the user may not do, or None when it is no ACL refusal."""
    if not isinstance(exc, redis.ResponseError):
        return None
    said = str(exc)
    if isinstance(exc, redis.exceptions.NoPermissionError):
        run = _RUN.search(said)
        return Refusal(run.group(1).lower() if run else None, run is None and "key" in said, said)
    inside = _IN_SCRIPT.search(said)
    if inside is None:
        return None
    if inside.group(1) != "run this command":
        return Refusal(None, True, said)
    return Refusal(_command_in_script(said), False, said)


def _command_in_script(said: str) -> str | None:
    """The command a refusal inside one of the router's scripts names, by its line."""
    sha, line = _SHA.search(said), _LINE.search(said)
    source = _SCRIPTS.get(sha.group(1)) if sha else None
    if source is None or line is None:
        return None
    lines = source.splitlines()
    number = int(line.group(1))
    commands = set(_CALLED.findall(lines[number - 1])) if 0 < number <= len(lines) else set()
    # One command a line in the router's scripts; should a line call two, neither is named.
    return commands.pop().lower() if len(commands) == 1 else None


def acl_user(url: str) -> str | None:
    """The Redis user a counter store URL logs in as (None: ``default``)."""
    try:
        user = urlsplit(url.split(",", 1)[0]).username
    except ValueError:
        return None
    return unquote(user) if user else None
