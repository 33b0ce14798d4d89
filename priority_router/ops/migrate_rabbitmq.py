"""``migrate`` on RabbitMQ: turn a live queue into a priority queue (``--to router``) or
back into a plain classic one (``--to plain``), under its own name.

RabbitMQ cannot change a queue's arguments, so the queue is emptied into a holding queue,
deleted, declared again with the target's arguments and bound as the app's queue
definition binds it, and what waits is moved back; the publishers that run the router
hold their publishes to it meanwhile (``integration/publisher_pause.py``).  The steps::

    declared holding queue   QUEUE.priority-router-holding, durable, with the target's arguments
    stopped consumers        remote-control cancel_consumer to each worker consuming QUEUE
    waited for workers       until no worker holds a document of QUEUE unacknowledged
    moved out                QUEUE -> holding queue, while publishers still publish to QUEUE
    paused publishers        mark QUEUE in the counter store, wait for publishes under way
    moved out                what was published since
    deleted                  QUEUE, only if it has no consumer and no message
    declared                 QUEUE with the target's arguments
    bound                    QUEUE to the exchanges of the app's queue definition
    resumed publishers       remove the mark: held publishes go to the new QUEUE
    moved back               holding queue -> QUEUE
    deleted holding queue

Every message moves exactly once (``amqp_moves.py``).  Nothing is kept but the broker's
own state: a rerun finds where a run stopped from whether the holding queue exists and
which arguments the queue accepts, and finishes.  ``PRIORITY_ROUTER_MIGRATE_KILL_AFTER``
(tests only, :class:`KillSwitch`) makes the command SIGKILL itself at a chosen point.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

from celery import Celery

from .. import headers as H
from ..errors import ConfigurationError
from ..integration.brokers import Transport, to_wire
from ..integration.publisher_pause import GRACE, Mark, MigrationMark
from ..integration.rabbitmq import channel_of
from ..redact import redact_url
from ..router import installed_router
from ..store.connection import make_client
from ..thresholds import is_priority
from . import rabbitmq_workers as workers
from .amqp_moves import BATCH, move
from .migration import MOVED_OUT, MigrationReport, Target
from .rabbitmq_queue import (
    HOLDING_SUFFIX,
    Kind,
    MigrationBlocked,
    QueueSpec,
    State,
    accepts,
    lock,
    passive,
    queue_spec,
    read_state,
)

__all__ = ["HOLDING_SUFFIX", "KILL_ENV", "MigrationBlocked", "migrate"]

#: Seconds to wait for the cancelled consumers to go.
CONSUMERS_TIMEOUT = 30.0
#: Seconds to wait for workers to run what they had fetched from the queue.
DRAIN_TIMEOUT = 120.0
#: Times the swap is tried again when a consumer or a message turns up in between.
SWAP_ATTEMPTS = 3
KILL_ENV = "PRIORITY_ROUTER_MIGRATE_KILL_AFTER"


class KillSwitch:
    """Tests only: SIGKILL this process when it passes the point ``KILL_ENV`` names: a
    step's action (``deleted``), its Nth time (``moved out#2``), the Nth batch committed
    moving out or back (``out-batch:N``, ``back-batch:N``) or the middle of the Nth batch,
    before its commit (``out-mid-batch:N``, ``back-mid-batch:N``)."""

    def __init__(self, point: str) -> None:
        self.point = point
        self._seen: dict[str, int] = {}

    def passed(self, name: str) -> None:
        if not self.point:
            return
        seen = self._seen[name] = self._seen.get(name, 0) + 1
        if self.point in (name, f"{name}#{seen}", f"{name}:{seen}"):
            os.kill(os.getpid(), signal.SIGKILL)


def migrate(
    app: Celery, queue: str, target: Target, dry_run: bool = False, publishers_stopped: bool = False
) -> MigrationReport:
    """Migrate ``queue`` for ``target``'s workers; rerun it to finish one cut off."""
    report = MigrationReport(queue, "rabbitmq", target, dry_run)
    spec = queue_spec(app, queue, target)
    mark = _publisher_mark(app, spec, target, publishers_stopped, dry_run)
    with app.connection_for_write() as conn:
        conn.connect()
        state = read_state(conn, spec)
        migration = Migration(app, conn, spec, report, mark)
        if dry_run:
            report.notes.append(state.describe(spec, target))
            migration.plan(state)
            return report
        with lock(conn, spec):
            state = read_state(conn, spec)  # as it is now that no other run can change it
            migration.step("found", state.describe(spec, target))
            migration.run(state)
    return report


def _publisher_mark(
    app: Celery, spec: QueueSpec, target: Target, publishers_stopped: bool, dry_run: bool
) -> MigrationMark | None:
    router = installed_router(app)
    if router is None:
        if publishers_stopped:
            return None
        raise ConfigurationError(
            "publishers",
            f"the app has no PriorityRouter installed, so nothing can pause its publishers while "
            f"{spec.name!r} is swapped, and what they publish meanwhile would be lost (RabbitMQ drops a "
            "message sent to a queue that does not exist)",
            "run it with -A the publishers' app, which has the router installed (for --to router install "
            "it on the publishers first; for --to plain migrate before removing it), or stop every "
            "publisher of the queue and add --publishers-stopped",
        )
    config = router.config
    client = make_client(config.redis_url, 2.0, 5.0)
    if not dry_run:
        try:
            client.ping()
        except Exception as exc:
            raise MigrationBlocked(
                f"cannot reach the counter store at {redact_url(config.redis_url)} ({exc}), where the "
                "migration tells the publishers to hold their publishes; nothing was changed. Fix the "
                "store and run the same command again"
            ) from None
    routes = frozenset(r for r in spec.routes if r[0])
    return MigrationMark(
        client, config.key_prefix, Mark(spec.vhost, spec.name, target.value, routes, time.time())
    )


class Migration:
    """One run: the steps from the state the broker is in to the end."""

    def __init__(
        self, app: Celery, conn: Any, spec: QueueSpec, report: MigrationReport, mark: MigrationMark | None
    ) -> None:
        self.app = app
        self.conn = conn
        self.spec = spec
        self.report = report
        self.mark = mark
        self.cancelled: list[str] = []
        #: The workers that answer remote control, and the queues each consumes.
        self.workers: dict[str, list[str]] = {}
        self.priced = 0
        self._kill = KillSwitch(os.environ.get(KILL_ENV, ""))
        self._paused_at: float | None = None

    # -- the steps, in order ------------------------------------------------------------

    def run(self, state: State) -> None:
        if state.kind is Kind.MISSING and state.holding is None:
            self.step("nothing to move", f"there is no queue {self.spec.name!r}: its workers declare it")
            return
        if state.kind is Kind.TARGET and state.holding is None:
            self._done_already()
            return
        self.report.changed = True
        if state.kind is Kind.OLD:
            self.hold_queue(state.holding)
            self.stop_consumers()
            self.wait_for_workers()
            self.move_out("publishers still publish to it")
            self.pause_publishers()
            try:
                self.swap()
                self.bind()
            except BaseException:
                self._give_up_pause()
                raise
        elif state.kind is Kind.MISSING and not self.declare():
            self.run(read_state(self.conn, self.spec))  # declared as the old kind meanwhile
            return
        else:
            self.bind()
        self.resume_publishers()
        self.move_back()
        self.delete_holding()
        self._notes()

    def hold_queue(self, holding: int | None) -> None:
        if holding is not None:
            self.step("holding queue", f"{self.spec.holding!r} exists and holds {holding} message(s)")
            return
        levels = (self.spec.target.queue_arguments or {}).get("x-max-priority")
        with channel_of(self.conn) as channel:
            channel.queue_declare(
                queue=self.spec.holding,
                durable=True,
                auto_delete=False,
                arguments={"x-max-priority": levels} if levels else {},
            )
        kind = f"x-max-priority={levels}" if levels else "plain"
        self.step("declared holding queue", f"{self.spec.holding!r} (durable, {kind})")

    def stop_consumers(self) -> None:
        self.workers = workers.roster(self.app)
        consuming = workers.consuming(self.workers, self.spec.name)
        workers.cancel(self.app, self.spec.name)
        self.cancelled = sorted(set(self.cancelled) | set(consuming))
        left = workers.wait_until(lambda: self._consumers(), CONSUMERS_TIMEOUT)
        if left:
            raise MigrationBlocked(
                f"{left} consumer(s) of {self.spec.name!r} are still there {CONSUMERS_TIMEOUT:g} s after the "
                f"workers that answer Celery's remote control were told to stop consuming it "
                f"({', '.join(consuming) or 'none answered'}); nothing was deleted. Fix: stop those "
                "consumers (workers with remote control off, other programs) and run the same command again"
            )
        who = ", ".join(self.cancelled) if self.cancelled else "no worker consumed it"
        self.step("stopped consumers", f"cancel_consumer({self.spec.name!r}): {who}; it has 0 consumers")

    def wait_for_workers(self) -> None:
        started = time.monotonic()
        # Every worker, not only those told to stop now: a cut-off run may have stopped them.
        everyone = list(self.workers)
        holding = workers.wait_until(
            lambda: workers.held(self.app, self.spec.routes, everyone), DRAIN_TIMEOUT
        )
        if holding:
            held = ", ".join(f"{w} ({n})" for w, n in holding.items())
            raise MigrationBlocked(
                f"workers still hold documents of {self.spec.name!r} they had fetched before they stopped "
                f"consuming it, {DRAIN_TIMEOUT:g} s on: {held}. Deleting the queue now would lose them if "
                "a worker gave them back. Fix: run the same command again once they have run them (the "
                "workers stay off the queue; nothing else changed), or stop those workers: a warm shutdown "
                "gives what they hold back to the queue"
            )
        self.step(
            "waited for workers",
            f"no worker holds a document of {self.spec.name!r} unacknowledged "
            f"(waited {time.monotonic() - started:.1f} s)",
        )

    def move_out(self, why: str) -> int:
        moved = self._move(self.spec.name, self.spec.holding)
        detail = f"{moved} message(s) from {self.spec.name!r} into {self.spec.holding!r}; {why}"
        self.step(MOVED_OUT, detail, moved)
        return moved

    def pause_publishers(self) -> None:
        if self.mark is None:
            self.step(
                "publishers stopped",
                f"--publishers-stopped: nothing publishes to {self.spec.name!r}, so nothing is held",
            )
            return
        self.mark.set()
        self._paused_at = time.monotonic()
        time.sleep(GRACE)
        self.step(
            "paused publishers",
            f"marked {self.spec.name!r} in the counter store: router publishers hold their publishes to "
            f"it; waited {GRACE:g} s for those under way",
        )

    def swap(self) -> None:
        from amqp.exceptions import PreconditionFailed

        for attempt in range(1, SWAP_ATTEMPTS + 1):
            self.move_out("published while the publishers were told to hold")
            with channel_of(self.conn) as channel:
                try:
                    channel.queue_delete(queue=self.spec.name, if_unused=True, if_empty=True)
                except PreconditionFailed as exc:
                    self.step("delete refused", f"{exc}; attempt {attempt} of {SWAP_ATTEMPTS}")
                    if self._consumers():
                        self.stop_consumers()
                    continue
            self.step("deleted", f"{self.spec.name!r} (it had no consumer and no message)")
            if self.declare():
                return
        raise MigrationBlocked(
            f"{self.spec.name!r} kept getting consumers or messages from outside the migration "
            f"({SWAP_ATTEMPTS} attempts): publishers without the router, or workers started meanwhile. "
            "Fix: stop them and run the same command again"
        )

    def declare(self) -> bool:
        if not accepts(self.conn, self.spec.target):
            self.step(
                "declared by another", f"{self.spec.name!r} was declared again as the old kind meanwhile"
            )
            return False
        args = self.spec.target.queue_arguments or {}
        shown = ", ".join(f"{k}={v}" for k, v in sorted(args.items())) or "no arguments"
        self.step(
            "declared",
            f"{self.spec.name!r} ({'durable' if self.spec.target.durable else 'transient'}, {shown})",
        )
        return True

    def bind(self) -> None:
        shown = []
        with channel_of(self.conn) as channel:
            bound = self.spec.target.bind(channel)
            for b in self.spec.bindings:
                b.exchange(channel).declare()
                bound.bind_to(b.exchange.name, b.routing_key, b.arguments)
                shown.append(str(b))
        self.step(
            "bound",
            "; ".join(shown) + " (from the app's queue definition)"
            if shown
            else "no binding in the app's queue definition: publishes reach it through the default exchange",
        )

    def resume_publishers(self) -> None:
        if self.mark is None or not self.mark.remove():
            return
        held = f" after {time.monotonic() - self._paused_at:.2f} s" if self._paused_at is not None else ""
        self.step(
            "resumed publishers", f"removed the mark{held}: held publishes go to the new {self.spec.name!r}"
        )

    def move_back(self) -> None:
        moved = self._move(self.spec.holding, self.spec.name)
        self.step(
            "moved back", f"{moved} message(s) from {self.spec.holding!r} into {self.spec.name!r}", moved
        )

    def delete_holding(self) -> None:
        with channel_of(self.conn) as channel:
            channel.queue_delete(queue=self.spec.holding, if_empty=True)
        self.step("deleted holding queue", repr(self.spec.holding))

    # -- helpers ----------------------------------------------------------------------

    def step(self, action: str, detail: str, messages: int = 0) -> None:
        self.report.step(action, detail, messages)
        self._kill.passed(action)

    def _move(self, source: str, dest: str) -> int:
        phase = "back" if dest == self.spec.name else "out"
        result = move(
            self.conn,
            source,
            dest,
            self._reprice if self.spec.unpriced else None,
            after_batch=lambda _: self._kill.passed(f"{phase}-batch"),
            in_batch=lambda n: self._kill.passed(f"{phase}-mid-batch") if n == BATCH // 2 else None,
        )
        self.priced += result.priced
        return result.moved

    def _reprice(self, properties: dict[str, Any]) -> bool:
        """Give a document no router priced (kombu sends those at priority 0, the lowest
        of a priority queue) the router's default priority, and one a router decided in dry
        run (which leaves the priority as Celery sets it) the priority it decided."""
        headers = properties.get("application_headers") or {}
        dry_run = headers.get(H.DRY_RUN)
        if properties.get("priority") or (H.REASON in headers and not dry_run):
            return False
        decided = headers.get(H.PRIORITY) if dry_run else None
        if is_priority(decided):
            properties["priority"] = to_wire(decided, Transport.AMQP)
        else:
            properties["priority"] = self.spec.unpriced
        return True

    def _consumers(self) -> int:
        found = passive(self.conn, self.spec.name)
        return 0 if found is None else found[1]

    def _give_up_pause(self) -> None:
        """The run fails while publishers are held: let them go now if the queue exists;
        else the mark lapses within seconds and each publisher declares the queue itself."""
        if self.mark is None:
            return
        self.mark.stop_renewing()
        with contextlib.suppress(Exception):
            if passive(self.conn, self.spec.name) is not None:
                self.mark.remove()

    def _done_already(self) -> None:
        self.step("nothing to move", f"{self.spec.name!r} already suits {self.report.target.value} workers")
        if self.mark is not None and self.mark.remove():
            self.step("resumed publishers", "removed the mark a cut-off migration had left")

    def _notes(self) -> None:
        spec, notes = self.spec, self.report.notes
        router = self.report.target is Target.ROUTER
        kind = "with" if router else "without"
        notes.append(f"start workers {kind} the router on {spec.name!r}; they declare it as it is now")
        if self.cancelled:
            notes.append(
                f"{', '.join(self.cancelled)} stopped consuming {spec.name!r} (each logged `Canceling queue "
                f"{spec.name}`) and consume nothing of it any more: stop them. Restarted as they are, they "
                + (
                    "fail on it with PRECONDITION_FAILED (inequivalent arg 'x-max-priority')"
                    if router
                    else "refuse to start on it (the router's CRITICAL line names the queue and the fix)"
                )
            )
        if router and self.priced:
            notes.append(
                f"{self.priced} document(s) published without the router or in dry run (priority 0 or "
                "none, the lowest of a priority queue) got the priority their dry run decided, or else "
                f"wire priority {spec.unpriced}, the router's default, so they are served among the routed "
                "documents rather than after all of them"
            )
        if not router:
            notes.append(
                "publishers that still run the router keep stamping priorities, which the queue now ignores; "
                "when each next connects it logs one ERROR (PRECONDITION_FAILED, x-max-priority) and goes on "
                "publishing: remove the router from them"
            )
        notes.append(
            "bindings not in the app's queue definition (added by hand or by another app) went with the old "
            "queue: AMQP cannot list them; add them again (rabbitmqctl list_bindings shows what is bound)"
        )

    def plan(self, state: State) -> None:
        spec, report = self.spec, self.report
        if state.kind is Kind.MISSING and state.holding is None:
            report.step("nothing to move", f"there is no queue {spec.name!r}: its workers declare it")
            return
        if state.kind is Kind.TARGET and state.holding is None:
            report.step("nothing to move", f"{spec.name!r} already suits {report.target.value} workers")
            return
        report.changed = True
        if state.kind is Kind.OLD:
            consuming = workers.consuming(workers.roster(self.app), spec.name)
            if state.holding is None:
                report.step("declare holding queue", repr(spec.holding))
            report.step("stop consumers", ", ".join(consuming) or "no worker consumes it")
            report.step("wait for workers", "until none holds a document of it unacknowledged")
            report.step(
                "move out", f"{state.ready} message(s) into {spec.holding!r}, and any published meanwhile"
            )
            report.step(
                "pause publishers",
                f"mark it in the counter store and wait {GRACE:g} s" if self.mark else "--publishers-stopped",
            )
            report.step("delete", f"{spec.name!r} once it has no consumer and no message")
        if state.kind is not Kind.TARGET:
            report.step("declare", f"{spec.name!r} with {spec.target.queue_arguments or 'no arguments'}")
        shown = [str(b) for b in spec.bindings]
        report.step("bind", "; ".join(shown) or "nothing: publishes reach it through the default exchange")
        if self.mark is not None:
            report.step("resume publishers", "remove the mark")
        report.step("move back", f"every message of {spec.holding!r} into {spec.name!r}")
        report.step("delete holding queue", repr(spec.holding))
