"""``priority-router``: the operator's command line.

    priority-router status [--json] [--limit N]
    priority-router inspect CLIENT [--json]
    priority-router reset CLIENT [--yes] | reset --all --yes
    priority-router tier set CLIENT [--weight W] [--shift S] [--fixed P] ... | tier unset CLIENT | tier list
    priority-router queues -A workers.app [--json]
    priority-router doctor -A workers.app [--json]
    priority-router migrate QUEUE --to router|plain -A workers.app [--dry-run] [--json] [--publishers-stopped]
    priority-router simulate TRACE --workers N [--tune] [--json] ...
    priority-router demo [--redis-url URL] [--heavy N] [--workers N] ...

The counter store comes from ``--redis-url`` or ``PRIORITY_ROUTER_REDIS_URL`` (and the
other ``PRIORITY_ROUTER_*`` variables); passwords are never printed.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import click
import redis
from rich.markup import escape
from rich.table import Table

from ..errors import ConfigurationError, CounterUnavailable, PriorityRouterError
from ..redact import redact_url
from ..router import PriorityRouter, engine_of, installed_router
from ..store.counter import Counter, CounterState
from ..store.gate import describe_held, held_by
from ..store.inflight import InflightCounter
from ..store.old_held import OldHeld, describe_old_held
from ..store.permissions import acl_user, refusal
from ..store.schema import marked_prefixes
from ..thresholds import table_name
from ..tiers import Tier
from .cli_context import (
    TIERS_OFF_NOTE,
    Context,
    answering_router,
    app_name_of,
    app_option,
    cannot_read,
    console,
    emit_json,
    fail,
    json_option,
    load_app,
    main,
    print_table,
    required_app,
    router_app_option,
    router_for,
    store_options,
)
from .migration import Target
from .saturation import describe as describe_saturation
from .saturation import saturation
from .simulate import simulate
from .tier_cli import tier

__all__ = ["main"]


def _row(router: PriorityRouter, state: CounterState) -> dict[str, Any]:
    interval = engine_of(router).store.reset_interval_ms / 1000
    ttl = state.ttl_ms / 1000 if state.ttl_ms is not None else None
    return {
        "client_id": state.client_id,
        "pending": state.pending,
        "priority": router.policy.priority_for(int(state.pending)),
        "seconds_since_update": round(interval - ttl, 3) if ttl is not None else None,
        "seconds_until_reset": round(ttl, 3) if ttl is not None else None,
        "tracked": ttl is not None,
        **(
            {"in_flight": state.counted if ttl is not None else 0}
            if engine_of(router).inflight is not None
            else {}
        ),
    }


@main.command()
@store_options
@json_option
@router_app_option
@click.option("--limit", type=int, default=None, help="Show at most this many clients.")
@click.pass_context
def status(ctx: click.Context, as_json: bool, app_name: str | None, limit: int | None) -> None:
    """Every tracked client: pending count, priority, last update, time to reset."""
    router = answering_router(ctx, app_name)
    try:
        rows = [_row(router, s) for s in engine_of(router).store.scan()]
        limited = bool(engine_of(router).limit_store.snapshot())
        if limited:
            # Clients whose count has reset may still have documents held.
            listed = {r["client_id"] for r in rows}
            rows += [
                _row(router, router.state(c))
                for c in engine_of(router).gate_store.holding()
                if c not in listed
            ]
            for r in rows:
                r["gate"] = _gate_row(router, r["client_id"])
        old_held = _old_held(router)
    except Exception as exc:
        fail(cannot_read(router, exc))
    rows.sort(key=lambda r: (r["priority"], -r["pending"], r["client_id"]))
    tracked = len(rows)
    saturated = saturation(router.policy, ((r["client_id"], r["pending"]) for r in rows if r["tracked"]))
    if limit is not None:
        rows = rows[:limit]
    if as_json:
        emit_json([{k: v for k, v in r.items() if k != "tracked"} for r in rows])
        return
    config = router.config
    table = Table(
        title=f"priority-router clients at {redact_url(config.redis_url)}, key prefix {config.key_prefix!r}"
    )
    inflight = engine_of(router).inflight is not None
    columns: tuple[str, ...] = ("client", "pending", "priority", "since update", "until reset")
    columns += ("in flight",) if inflight else ()
    columns += ("running", "held", "limits") if limited else ()
    for column in columns:
        # Folded, never cut with an ellipsis: at 80 columns a client id or its limits must still
        # be read whole.
        table.add_column(
            column, justify="left" if column in ("client", "limits") else "right", overflow="fold"
        )
    for r in rows:
        table.add_row(
            r["client_id"],
            str(r["pending"]),
            str(r["priority"]),
            _seconds(r["seconds_since_update"]),
            _seconds(r["seconds_until_reset"]),
            *((str(r["in_flight"]),) if inflight else ()),
            *(_gate_cells(r["gate"]) if limited else ()),
        )
    print_table(table)
    shown = f", {len(rows)} shown" if len(rows) < tracked else ""
    console.print(
        f"{tracked} client(s) tracked in the {router.config.mode} mode{shown}; threshold table: "
        f"{escape(table_name(router.policy))}"
    )
    if saturated is not None:
        problem, fix = describe_saturation(saturated, router.policy, router.config.mode)
        console.print(f"[yellow]{escape(problem)}.[/] Fix: {escape(fix)}")
    if old_held:
        console.print(f"[yellow]{escape(describe_old_held(old_held))}[/]")
    if not tracked and app_name_of(ctx, app_name) is None:
        prefix = router.config.key_prefix
        marked = marked_prefixes(engine_of(router).redis)
        if marked and prefix not in marked:
            shown = ", ".join(repr(p) for p in marked)
            console.print(
                f"(no router has used key prefix {prefix!r} here; this store holds keys under "
                f"{escape(shown)}: add --key-prefix PREFIX, or -A your app)"
            )
        else:
            other = "seed" if inflight else "inflight"
            console.print(
                f"(a router in the {other} mode keeps other keys: add --mode {other}, or -A your app)"
            )


def _old_held(router: PriorityRouter, client_id: str | None = None) -> dict[str, int]:
    """Documents an older release's workers hold in the counter store, by client (of
    ``client_id`` only, given one); a user refused the commands that count them is told so
    on stderr, and the rest is shown."""
    old = OldHeld(engine_of(router).redis, router.config.key_prefix)
    try:
        return old.counts() if client_id is None else {client_id: old.count(client_id)}
    except redis.ResponseError as exc:
        refused = refusal(exc)
        if refused is None:
            raise
        config = router.config
        click.echo(
            f"priority-router: could not look for documents an older release's workers hold in the counter "
            f"store: it refuses {refused.problem()} to its Redis user. Fix: "
            f"{refused.fix(acl_user(config.redis_url), config.key_prefix)}",
            err=True,
        )
        return {}


def _gate_cells(gate: dict[str, Any] | None) -> tuple[str, str, str]:
    if gate is None:
        return "-", "-", "-"
    held = f"{gate['held']} ({gate['held_by']})" if gate["held"] else "0"
    return str(gate["running"]), held, gate["limits"] or "-"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} s"


@main.command()
@store_options
@click.argument("client")
@json_option
@router_app_option
@click.pass_context
def inspect(ctx: click.Context, client: str, as_json: bool, app_name: str | None) -> None:
    """One client's pending count, priority and tier (read-only)."""
    router = answering_router(ctx, app_name)
    try:
        state = router.state(client)
    except ValueError as exc:
        fail(str(exc), 2)
    except Exception as exc:
        fail(cannot_read(router, exc))
    row = _row(router, state)
    row["key"] = state.key
    try:
        row["tier"], applied = _tier_in_effect(router, state.client_id)
        gate = _gate_row(router, state.client_id)
    except CounterUnavailable as exc:
        fail(str(exc))
    # What peek() gives: the priority at the current count with the tier; the table's beside it.
    row["table_priority"] = row["priority"]
    if applied is not None and router.config.tiers:
        row["priority"] = applied.priority(state.pending, router.policy)
    # The costs counted: in the spell (seed), of the documents in flight (inflight).
    row["counted"] = state.counted
    # Added after the keys scripts already read, in the order they read them.
    row["thresholds"] = table_name(router.policy)
    if gate is not None:
        row["gate"] = gate
    try:
        old_held = _old_held(router, state.client_id).get(state.client_id, 0)
    except Exception as exc:
        fail(cannot_read(router, exc))
    if old_held:
        row["held_by_older_release"] = old_held
    if as_json:
        emit_json(row)
        return
    table = Table(show_header=False)
    for key, value in row.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {'-' if v is None else v}" for k, v in value.items())
        table.add_row(escape(key), "-" if value is None else escape(str(value)))
    print_table(table)
    if row["tier"] is not None and not router.config.tiers:
        console.print(TIERS_OFF_NOTE)
    if old_held:
        console.print(f"[yellow]{escape(describe_old_held({state.client_id: old_held}))}[/]")


def _gate_row(router: PriorityRouter, client_id: str) -> dict[str, Any] | None:
    """The client's running and held documents under its limits; None when it has no limits
    and nothing of it is held.  Raises CounterUnavailable."""
    limits = router.limits(client_id)
    state = router.gate_state(client_id)
    if not limits and not state.running and not state.held:
        return None
    return {
        "running": state.running,
        "held": state.held,
        "held_by": held_by(state, limits),
        "limits": limits.describe() or None,
    }


def _tier_in_effect(router: PriorityRouter, client_id: str) -> tuple[str | None, Tier | None]:
    """The tier the router applies to ``client_id``, written as ``Decision.tier`` and the
    ``priority_router_tier`` header write it (``client: weight=2``, ``default: fixed=9``),
    and the tier; (None, None) when the threshold table alone decides.  A tier stored in a
    form this version cannot read is named with its fix (the router then uses the table).
    Raises CounterUnavailable."""
    try:
        own = router.tier(client_id)
    except ConfigurationError as exc:
        return f"client: invalid ({exc.problem}; the threshold table applies. Fix: {exc.fix})", None
    if own is not None:
        return own.applied_as("client"), own
    try:
        default = router.default_tier()
    except ConfigurationError as exc:
        return (
            f"default: invalid ({exc.problem}; publishers keep the default they last read. Fix: {exc.fix})",
            None,
        )
    if default is None:
        return None, None
    return default.applied_as("default"), default


@main.command()
@store_options
@click.argument("client", required=False)
@click.option("--all", "everyone", is_flag=True, help="Reset every client.")
@click.option("--yes", is_flag=True, help="Do it without asking.")
@router_app_option
@click.pass_context
def reset(ctx: click.Context, client: str | None, everyone: bool, yes: bool, app_name: str | None) -> None:
    """Forget CLIENT's count (or every client's with --all), in both counting modes' keys:
    next document at pending 0."""
    if everyone == (client is not None):
        fail("name one CLIENT, or pass --all (not both)", 2)
    if everyone and not yes:
        fail("reset --all forgets every client's count; add --yes to confirm", 2)
    router = answering_router(ctx, app_name)
    if everyone:
        try:
            config = router.config
            seed = Counter(engine_of(router).redis, config.key_prefix, config.reset_interval).clear_all()
            inflight = InflightCounter(
                engine_of(router).redis, config.key_prefix, config.reset_interval
            ).clear_all()
        except Exception as exc:
            fail(f"cannot reset at {redact_url(router.config.redis_url)}: {exc}")
        # Both modes' keys: a router switched from one mode leaves the other's.
        said = f"{seed} key(s) of the seed mode, {inflight} of the inflight mode"
        click.echo(f"reset every client's count: {said}")
        return
    assert client is not None
    if not yes and not click.confirm(f"Reset the pending count of {client!r}?", default=False):
        fail("nothing reset", 1)
    try:
        had = router.reset(client)
    except ValueError as exc:
        fail(str(exc), 2)
    except CounterUnavailable as exc:
        fail(str(exc))
    click.echo(f"reset {client!r}" if had else f"{client!r} had no count; nothing to reset")


@main.command()
@app_option
@json_option
@click.pass_context
def queues(ctx: click.Context, app_name: str | None, as_json: bool) -> None:
    """Messages waiting in each of the app's queues (per priority level on Redis)."""
    from ..integration.brokers import Transport, from_wire
    from .queues import queue_depths

    app_name = required_app(ctx, app_name)
    app = load_app(app_name)
    try:
        depths = queue_depths(app)
    except PriorityRouterError as exc:
        fail(str(exc), 2)
    except Exception as exc:
        fail(f"cannot read the broker: {exc}")
    if as_json:
        emit_json(
            {
                "transport": depths.transport.value,
                "unacked": depths.unacked,
                "queues": [dataclasses.asdict(q) for q in depths.queues],
                "polled_steps": depths.polled_steps,
                "unpolled": depths.unpolled(),
            }
        )
        return
    table = Table(title=f"queues ({depths.transport.value})")
    table.add_column("queue")
    if depths.transport is Transport.REDIS:
        steps = sorted({s for q in depths.queues for s in q.by_priority})
        for step in steps:
            table.add_column(
                "first" if step == 0 else f"p{from_wire(step, depths.transport)}", justify="right"
            )
        table.add_column("total", justify="right")
        for q in depths.queues:
            table.add_row(q.queue, *(str(q.by_priority.get(s, 0)) for s in steps), str(q.ready))
        if 0 in steps:
            table.caption = (
                "first: the list served before p1: documents published without a priority (no router), "
                "and those max_wait serves first; doctor counts the former"
            )
    else:
        table.add_column("ready", justify="right")
        table.add_column("consumers", justify="right")
        for q in depths.queues:
            ready = "missing" if q.ready is None else str(q.ready)
            table.add_row(q.queue, ready, "-" if q.consumers is None else str(q.consumers))
    print_table(table)
    if depths.unacked is not None:
        console.print(f"{depths.unacked} message(s) delivered to workers and not yet acknowledged")
    for name, waiting in depths.unpolled().items():
        # Unwrapped, so the command can be copied whole.
        click.echo(
            f"{waiting} message(s) of {name!r} wait in lists this app's workers do not poll (they "
            f"poll {depths.polled_steps}); free them with: priority-router migrate "
            f"{shlex.quote(name)} --to plain -A {shlex.quote(app_name)}"
        )
    if depths.transport is Transport.AMQP:
        console.print("RabbitMQ reports total depth only; AMQP has no per-priority breakdown.")


def _autoscale_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"\d+(,\d+)?", value.strip()):
        raise click.BadParameter(f"{value!r}: give MAX,MIN as `celery worker --autoscale` takes it, e.g. 4,1")
    return value


@main.command()
@app_option
@json_option
@click.option(
    "-P",
    "--pool",
    default=None,
    help="The worker pool, as for `celery worker -P` (prefork, threads, solo, gevent, eventlet) "
    "[the pool the live workers report, else the app's worker_pool].",
)
@click.option(
    "-c",
    "--concurrency",
    type=int,
    default=None,
    help="The worker's concurrency, as for `celery worker -c` [the live workers', else the app's "
    "worker_concurrency].",
)
@click.option(
    "--autoscale",
    default=None,
    metavar="MAX,MIN",
    callback=_autoscale_option,
    help="The worker's --autoscale, as for `celery worker --autoscale` [the live workers'].",
)
@click.pass_context
def doctor(
    ctx: click.Context,
    app_name: str | None,
    as_json: bool,
    pool: str | None,
    concurrency: int | None,
    autoscale: str | None,
) -> None:
    """Check what silently defeats priorities; exit 1 when anything does."""
    from ..integration.pools import pool_of_options
    from .doctor import diagnose

    app_name = required_app(ctx, app_name)
    app = load_app(app_name, refuse_bad_settings=False)  # diagnose reports it
    worker_pool = None  # the live workers' pool, else the app's settings'
    if pool is not None or concurrency is not None or autoscale is not None:
        options = {"pool": pool, "concurrency": concurrency, "autoscale": autoscale}
        try:
            worker_pool = pool_of_options(options, app.conf)
        except Exception as exc:
            fail(f"unknown worker pool {pool!r} ({exc}); use prefork, threads, solo, gevent or eventlet", 2)
    try:
        findings = diagnose(app, worker_pool)
    except PriorityRouterError as exc:
        fail(str(exc), 2)
    problems = [f for f in findings if not f.ok]
    if as_json:
        emit_json([dataclasses.asdict(f) for f in findings])
    else:
        table = Table(title=f"priority-router doctor: {app_name}")
        for column in ("check", "", "detail", "fix"):
            # Fold, never cut: a fix names code to call, and piped output is 80 columns wide.
            table.add_column(column, overflow="fold")
        for f in findings:
            mark = "[green]ok[/]" if f.ok else "[red]FAIL[/]"
            table.add_row(f.check, mark, f.detail, f.fix)
        print_table(table)
        console.print(f"{len(problems)} problem(s)" if problems else "no problems found")
    if problems:
        sys.exit(1)


@main.command()
@click.argument("queue")
@click.option(
    "--to",
    "target",
    type=click.Choice([t.value for t in Target]),
    required=True,
    help="router: the queue's documents are served by router workers next; plain: by plain Celery.",
)
@app_option
@click.option("-b", "--broker", "broker_url", default=None, help="The broker URL, instead of -A.")
@click.option("--dry-run", is_flag=True, help="Print what would be done; change nothing.")
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=500,
    show_default=True,
    help="Redis: messages moved per call (each call holds Redis about a millisecond per 500).",
)
@click.option(
    "--publishers-stopped",
    is_flag=True,
    help="RabbitMQ: nothing publishes to QUEUE (needed when the app has no router to pause its publishers).",
)
@json_option
@click.pass_context
def migrate(
    ctx: click.Context,
    queue: str,
    target: str,
    app_name: str | None,
    broker_url: str | None,
    dry_run: bool,
    batch: int,
    publishers_stopped: bool,
    as_json: bool,
) -> None:
    """Move QUEUE's waiting documents between the router's layout and plain Celery's,
    while publishers and workers run; rerun it to finish one that was cut off."""
    from ..integration.brokers import Transport, transport_of
    from . import migrate_rabbitmq, migrate_redis

    app = _migration_app(ctx, app_name, broker_url)
    # Each step is printed as it happens (on stderr, so --json output stays one document).
    steps = logging.StreamHandler(sys.stderr)
    steps.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    log = logging.getLogger("priority_router.migrate")
    log.addHandler(steps)
    log.setLevel(logging.INFO)
    try:
        transport = transport_of(app)
        if transport is Transport.REDIS:
            report = migrate_redis.migrate(app, queue, Target(target), dry_run=dry_run, batch=batch)
        else:
            report = migrate_rabbitmq.migrate(
                app, queue, Target(target), dry_run=dry_run, publishers_stopped=publishers_stopped
            )
    except PriorityRouterError as exc:
        fail(str(exc), 2)
    except Exception as exc:
        fail(f"the migration of {queue!r} stopped: {exc}; fix that and run the same command again")
    finally:
        log.removeHandler(steps)
    if report.target is Target.PLAIN:
        held = _held_documents_note(ctx, app_name, broker_url)
        if held:
            report.notes.append(held)
    if as_json:
        emit_json(report.as_dict())
        return
    for note in report.notes:
        click.echo(f"note: {note}")
    if not report.dry_run and report.changed:
        click.echo(f"{queue!r} now serves {report.target.value} workers ({report.moved} message(s) moved)")


def _held_documents_note(ctx: click.Context, app_name: str | None, broker_url: str | None) -> str | None:
    """What a switch-off would strand: documents held by caps wait in their holding queues
    on the broker, and only router workers release them."""
    app = app_name_of(ctx, app_name)
    if app is not None and installed_router(load_app(app)) is None:
        return None  # a plain app names no store; the publishers' app does
    try:
        held = engine_of(router_for(ctx, app_name if broker_url is None else None)).gate_store.held_now()
    except Exception as exc:
        return f"could not count documents held by caps in the counter store ({exc})"
    if not held:
        return None
    return (
        f"{describe_held(held)}: only router workers release them, so stopping the last one strands them. "
        "Lift the limits first (priority-router tier unset CLIENT, and --default) and keep a router worker "
        "running until `priority-router status` shows none held"
    )


def _migration_app(ctx: click.Context, app_name: str | None, broker_url: str | None) -> Any:
    name = app_name_of(ctx, app_name)
    if broker_url is not None:
        if name is not None:
            raise click.UsageError("give either -A / --app or -b / --broker, not both")
        from celery import Celery

        return Celery("priority-router-migrate", broker=broker_url, set_as_current=False)
    if name is None:
        raise click.UsageError("Missing option '-A' / '--app' (or '-b' / '--broker' with the broker URL).")
    return load_app(name)


@main.command()
@click.option("--heavy", type=int, default=300, show_default=True, help="Documents the heavy client dumps.")
@click.option("--light-clients", type=int, default=12, show_default=True)
@click.option("--light-docs", type=int, default=3, show_default=True, help="Documents per light client.")
@click.option("--doc-ms", type=float, default=40, show_default=True, help="Milliseconds per document.")
@click.option("--workers", type=int, default=2, show_default=True, help="Worker processes.")
@click.option("--threads", type=int, default=4, show_default=True, help="Threads per worker.")
@click.option(
    "--chart",
    type=click.Path(dir_okay=False),
    default="demo-results.png",
    show_default=True,
    help="The chart to write (needs matplotlib: pip install 'priority-router[plot]').",
)
@click.option(
    "--redis-url",
    envvar="REDIS_URL",
    default=None,
    metavar="URL",
    help="The Redis to run on: its databases 13, 14 and 15, or the one the URL names and the next "
    "two [REDIS_URL; else redis://127.0.0.1:6379 if it answers, else a throwaway redis-server "
    "from PATH].",
)
@click.pass_context
def demo(
    ctx: click.Context,
    heavy: int,
    light_clients: int,
    light_docs: int,
    doc_ms: float,
    workers: int,
    threads: int,
    chart: str,
    redis_url: str | None,
) -> None:
    """Run a noisy-neighbour workload on plain Celery, then with the router, and compare.

    Starts its own Celery workers and deletes what it wrote to Redis when it ends (also on
    Ctrl-C).
    """
    from ..demo.run import Workload, run_demo
    from ..simulation.workloads import NoisyNeighbour

    if min(heavy, light_clients, light_docs, workers, threads) < 1 or doc_ms <= 0:
        fail("every count must be at least 1 and --doc-ms positive", 2)
    source = "REDIS_URL"
    if ctx.get_parameter_source("redis_url") is click.core.ParameterSource.COMMANDLINE:
        source = "--redis-url"
    else:
        # ``priority-router --redis-url URL demo``: typed before the subcommand, it counts too.
        context = ctx.find_object(Context)
        typed = context.typed.get("redis_url") if context is not None else None
        if typed is not None:
            redis_url, source = str(typed), "--redis-url"
    documents = NoisyNeighbour(
        heavy=heavy, light_clients=light_clients, light_docs=light_docs, doc_seconds=doc_ms / 1000
    )
    workload = Workload(documents, workers=workers, threads=threads)
    sys.exit(run_demo(workload, Path(chart), redis_url, source))


main.add_command(simulate)
main.add_command(tier)
