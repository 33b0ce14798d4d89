"""``migrate`` on the Redis broker: free the documents of the priority lists that plain
Celery workers do not poll.

kombu's Redis transport keeps one list per priority step.  The router's workers poll all
ten (``0..9``); plain Celery's poll kombu's four (``0, 3, 6, 9``) unless the app sets other
``priority_steps``.  Switching the router off therefore strands what waits in lists 1, 2,
4, 5, 7 and 8; ``--to plain`` moves each of those messages into the polled list of the
nearest lower urgency (1 and 2 into 3, 4 and 5 into 6, 7 and 8 into 9), by
``lua/move_to_plain.lua``.  Switching on needs no move: router workers poll every list.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from kombu.transport.redis import PRIORITY_STEPS as KOMBU_PRIORITY_STEPS

from ..integration.celery_internals import step_list
from ..integration.celery_settings import REDIS_PRIORITY_STEPS
from ..router import installed_router
from .migration import MigrationReport, Target

SCRIPT = (Path(__file__).parent / "lua" / "move_to_plain.lua").read_text()
#: Messages one script call moves at most by default.
BATCH = 500


def plain_steps(app: Celery) -> list[int]:
    """The priority steps the app's workers poll once the router is off: the app's own
    ``priority_steps`` if it runs without the router, else kombu's default."""
    if installed_router(app) is None:
        options = app.conf.broker_transport_options or {}
        return sorted(int(s) for s in options.get("priority_steps", KOMBU_PRIORITY_STEPS))
    return list(KOMBU_PRIORITY_STEPS)


def destinations(polled: list[int]) -> dict[int, list[int]]:
    """Each polled step and the unpolled steps whose messages go into it, least urgent
    first: the nearest polled step of lower urgency, or the least urgent polled step for
    an unpolled step beyond it."""
    moves: dict[int, list[int]] = {}
    for step in REDIS_PRIORITY_STEPS:
        if step in polled:
            continue
        lower = [p for p in polled if p > step]
        target = min(lower) if lower else max(polled)
        moves.setdefault(target, []).insert(0, step)
    return moves


class RedisQueue:
    """One kombu Redis queue's priority lists, named as the app's channel names them."""

    def __init__(self, app: Celery, queue: str) -> None:
        self.app = app
        self.queue = queue

    def __enter__(self) -> RedisQueue:
        self._conn = self.app.connection_for_write()
        channel = self._conn.default_channel
        self.prefix: str = channel.global_keyprefix or ""
        self.unacked_key: str = self.prefix + channel.unacked_key
        # A plain client on kombu's pool: kombu's own prefixes keys a second time.
        self.client = redis.Redis(connection_pool=channel.client.connection_pool)
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.release()

    def key(self, step: int) -> str:
        return self.prefix + step_list(self._conn.default_channel, self.queue, step)

    def depths(self) -> dict[int, int]:
        with self.client.pipeline(transaction=False) as pipe:
            for step in REDIS_PRIORITY_STEPS:
                pipe.llen(self.key(step))
            return dict(zip(REDIS_PRIORITY_STEPS, map(int, pipe.execute()), strict=True))

    def unacked(self) -> int:
        """Messages of this queue delivered to workers and not yet acknowledged."""
        count = 0
        for _, raw in self.client.hscan_iter(self.unacked_key, count=500):
            try:
                _, _, routing_key = json.loads(raw)
            except (ValueError, TypeError):
                continue
            count += str(routing_key) == self.queue
        return count


def migrate(
    app: Celery, queue: str, target: Target, dry_run: bool = False, batch: int = BATCH
) -> MigrationReport:
    report = MigrationReport(queue, "redis", target, dry_run)
    if target is Target.ROUTER:
        report.step(
            "nothing to move",
            "on Redis the router's workers poll every priority list, the four plain Celery polls "
            "among them, so documents already waiting are served as they are",
        )
        report.notes.append(
            "install the router on the workers, then on the publishers (PriorityRouter(...).install(app))"
        )
        return report
    polled = plain_steps(app)
    with RedisQueue(app, queue) as lists:
        before = lists.depths()
        for into, sources in destinations(polled).items():
            waiting = sum(before[s] for s in sources)
            names = ", ".join(str(s) for s in reversed(sources))
            if not waiting:
                continue
            if dry_run:
                report.step("move", f"{waiting} message(s) from lists {names} into list {into}", 0)
                report.changed = True
                continue
            moved = _move(lists, into, sources, batch)
            report.changed = report.changed or moved > 0
            report.step("moved", f"{moved} message(s) from lists {names} into list {into}", moved)
        if not report.changed:
            report.step(
                "nothing to move", f"no message waits in a list plain workers skip (polled: {polled})"
            )
        held = lists.unacked()
    if held:
        report.notes.append(
            f"{held} message(s) of {queue!r} are delivered to workers and not yet acknowledged; a "
            "worker still running the router that stops returns its share to the router's lists: "
            "run this command again once the last router worker has stopped"
        )
    report.notes.append(
        f"plain workers poll lists {polled}; `priority-router queues -A APP` shows what waits where"
    )
    return report


def _move(lists: RedisQueue, into: int, sources: list[int], batch: int) -> int:
    script: Any = lists.client.register_script(SCRIPT)
    keys = [lists.key(into), *(lists.key(s) for s in sources)]
    total = 0
    while moved := int(script(keys=keys, args=[batch])):
        total += moved
    return total
