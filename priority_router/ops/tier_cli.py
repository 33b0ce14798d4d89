"""``priority-router tier``: per-client tiers (``tiers.py``), changed at run time.

    priority-router tier set acme --weight 2 --shift -1
    priority-router tier set --default --fixed 9
    priority-router tier set internal --neutral        # exempt from the default tier
    priority-router tier unset acme | tier unset --default
    priority-router tier list [--json]

The store options and ``-A app`` work as for ``status``; ``cli.py`` adds the group to
``main``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ..errors import ConfigurationError, CounterUnavailable
from ..limits import Limits
from ..redact import redact_url
from ..router import PriorityRouter, engine_of
from ..store.breaker import STORE_ERRORS
from ..store.client_ids import normalize_client_id
from ..store.connection import store_error
from ..store.limit_store import LIMITS_REFRESH
from ..store.tier_store import DEFAULT_TIER_REFRESH
from ..tiers import Tier
from .cli_context import (
    TIERS_OFF_NOTE,
    answering_router,
    cannot_read,
    console,
    emit_json,
    fail,
    json_option,
    print_table,
    router_app_option,
    store_options,
)

#: What a read of the store after a change may raise.
UNREADABLE: tuple[type[BaseException], ...] = (CounterUnavailable, *STORE_ERRORS)
#: Printed after every change: a publisher built with ``tiers=False`` never reads a tier.
IGNORED_NOTE = "Publishers with tiers=False ignore tiers."


@click.group()
def tier() -> None:
    """Per-client tiers: a weight, a shift or a fixed priority, changed without a deploy.

    \b
    tier set CLIENT | --default, with:
    --weight W               each document counts 1/W (2: drops a level half as fast)
    --shift S                the table's priority moved by S levels, within 1..9
    --fixed P                priority P for every document, whatever the count
    --neutral                a tier that changes nothing (exempt from the default)
    --max-in-flight N        at most N documents running at once (docs/caps.md)
    --max-cost-in-flight C   at most C units of cost running at once
    --borrow                 run beyond the cap while nobody else waits
    --rate R/s|R/m|R/h       at most R documents starting per second, minute or hour
    --burst B                the rate's bucket: up to B starting at once
    tier unset CLIENT | --default
    tier list [--json]

    The default tier applies to every client without a tier of its own.
    """


def _target(client: str | None, default: bool) -> None:
    if default == (client is not None):
        fail("name one CLIENT, or pass --default for the default tier (not both)", 2)


@tier.command("set")
@store_options
@click.argument("client", required=False)
@click.option("--default", is_flag=True, help="Set the default tier: every client without one of its own.")
@click.option(
    "--weight", type=float, help="Each document counts 1/W: 2 drops a level half as fast, 0.5 twice."
)
@click.option(
    "--shift", type=int, help="Move the priority by whole levels (-1: one more urgent), within 1..9."
)
@click.option("--fixed", type=int, help="One priority, 1..9, for every document whatever the count.")
@click.option(
    "--max-in-flight", type=int, help="At most N of the client's documents run at once, on all workers."
)
@click.option(
    "--max-cost-in-flight", type=float, help="At most C units of cost (priority_router_cost) run at once."
)
@click.option(
    "--borrow", is_flag=True, help="A capped client may run beyond its cap while nobody else waits."
)
@click.option("--rate", help="At most R documents start per unit: 5/s, 100/m, 1000/h (a token bucket).")
@click.option("--burst", type=int, help="The rate's bucket: up to B documents start at once (R by default).")
@click.option(
    "--neutral", is_flag=True, help="A tier that changes nothing: exempts CLIENT from the default tier."
)
@router_app_option
@click.pass_context
def set_tier(
    ctx: click.Context,
    client: str | None,
    default: bool,
    weight: float | None,
    shift: int | None,
    fixed: int | None,
    max_in_flight: int | None,
    max_cost_in_flight: float | None,
    borrow: bool,
    rate: str | None,
    burst: int | None,
    neutral: bool,
    app_name: str | None,
) -> None:
    """Give CLIENT a tier of its own (or set the default tier with --default).

    A new tier replaces the client's whole tier: options not given are back to neutral
    (a cap not given again is lifted).
    """
    _target(client, default)
    limited = borrow or any(v is not None for v in (max_in_flight, max_cost_in_flight, rate, burst))
    given = weight is not None or shift is not None or fixed is not None or limited
    if neutral and given:
        fail("--neutral stores a tier that changes nothing; give it alone, or drop it", 2)
    if not neutral and not given:
        fail(
            "give --weight, --shift, --fixed and/or a limit (--max-in-flight, --rate; or --neutral to "
            "exempt CLIENT from the default tier)",
            2,
        )
    if neutral and default:
        fail(
            "a neutral default tier changes nothing; to remove the default tier, run "
            "`priority-router tier unset --default`",
            2,
        )
    try:
        limits = Limits(max_in_flight, borrow, rate, burst, max_cost_in_flight)
        chosen = Tier(1.0 if weight is None else weight, 0 if shift is None else shift, fixed, limits)
    except ConfigurationError as exc:
        fail(str(exc), 2)
    router = answering_router(ctx, app_name)
    settings: dict[str, Any] = chosen.as_dict()  # set_tier's keywords
    try:
        if client is None:
            before = _tier_text(router.default_tier)
            router.set_default_tier(**settings)
        else:
            before = _tier_text(lambda: router.tier(client))
            router.set_tier(client, **settings)
    except CounterUnavailable as exc:
        fail(str(exc))
    except ValueError as exc:  # not a client id
        fail(str(exc), 2)
    click.echo(f"{'default' if client is None else _shown_id(client)}: {chosen.describe()} (was: {before})")
    priced = (chosen.weight, chosen.shift, chosen.fixed) != (1, 0, None)
    if client is None:
        click.echo(
            "It applies to every client without a tier of its own; publishers read it again within "
            f"{DEFAULT_TIER_REFRESH:g} s. {IGNORED_NOTE}"
        )
    elif priced or not limited:
        click.echo(
            "In effect from the client's next publish (a deployment's first tier: within "
            f"{DEFAULT_TIER_REFRESH:g} s). {IGNORED_NOTE}"
        )
    else:
        click.echo(
            "Its priority follows the table alone: a tier of its own replaces the default tier "
            "(add --weight, --shift or --fixed to change that)."
        )
    if limited:
        click.echo(
            f"Workers apply the limits within {LIMITS_REFRESH:g} s; documents they hold start as the "
            "client's running ones end (docs/caps.md)."
        )
    if not router.config.tiers:
        click.echo(TIERS_OFF_NOTE)


@tier.command()
@store_options
@click.argument("client", required=False)
@click.option("--default", is_flag=True, help="Remove the default tier.")
@router_app_option
@click.pass_context
def unset(ctx: click.Context, client: str | None, default: bool, app_name: str | None) -> None:
    """Remove CLIENT's own tier (the default tier applies again), or the default tier."""
    _target(client, default)
    router = answering_router(ctx, app_name)
    try:
        had = router.unset_default_tier() if client is None else router.unset_tier(client)
    except CounterUnavailable as exc:
        fail(str(exc))
    except ValueError as exc:  # not a client id
        fail(str(exc), 2)
    if client is None:
        message = (
            "default tier removed: clients without a tier of their own get the threshold table "
            f"(publishers read it again within {DEFAULT_TIER_REFRESH:g} s)"
            if had
            else "no default tier was set; nothing removed"
        )
    elif had:
        message = f"{_shown_id(client)}: tier removed; {_applies_now(router)}"
    else:
        message = f"{_shown_id(client)} had no tier of its own; nothing removed"
    click.echo(message)
    # Done: the count of held documents is a note, and a store that cannot give it does not
    # turn the removal into a failure.
    try:
        held = (
            router.gate_state(client).held
            if client
            else sum(state.held for state in engine_of(router).gate_store.held_now().values())
        )
    except UNREADABLE as exc:
        why = str(exc) if isinstance(exc, CounterUnavailable) else store_error(exc)
        click.echo(
            f"priority-router: could not count the documents its limits held ({why}); "
            "`priority-router status` lists them",
            err=True,
        )
        return
    if held:
        click.echo(
            f"{held} document(s) held by caps wait in their holding queue: workers with the router start "
            "those the limits now allow within 2 s; while none runs, they wait (docs/caps.md)"
        )


@tier.command("list")
@store_options
@json_option
@router_app_option
@click.pass_context
def list_tiers(ctx: click.Context, as_json: bool, app_name: str | None) -> None:
    """Every client with a tier of its own, sorted, and the default tier."""
    router = answering_router(ctx, app_name)
    try:
        limits = engine_of(router).limit_store.all()
        rows = sorted(
            (
                {"client_id": client, **_tier_row(_with_limits(found, limits.get(client)))}
                for client, found in engine_of(router).tier_store.scan()
            ),
            key=lambda r: str(r["client_id"]),
        )
        try:
            stored_default: Tier | ConfigurationError | None = router.default_tier()
        except ConfigurationError as exc:
            stored_default = exc
    except Exception as exc:
        fail(cannot_read(router, exc))
    default_row = None if stored_default is None else _tier_row(stored_default)
    if as_json:
        emit_json({"clients": rows, "default": default_row})
        return
    # A heading of its own: a title would wrap to the width of this narrow table.
    console.print(f"priority-router tiers at {escape(redact_url(router.config.redis_url))}")
    table = Table()
    table.add_column("client", overflow="fold")
    table.add_column("tier", overflow="fold")
    for r in rows:
        table.add_row(escape(str(r["client_id"])), escape(_shown(r)))
    print_table(table)
    invalid = sum(1 for r in rows if r["error"] is not None)
    console.print(
        f"{len(rows)} client(s) with a tier of their own" + (f", {invalid} invalid" if invalid else "")
    )
    if default_row is None:
        console.print("No default tier: clients without a tier of their own get the threshold table.")
    else:
        console.print(f"Default tier, for every other client: {escape(_shown(default_row))}")
    if not router.config.tiers:
        console.print(TIERS_OFF_NOTE)


def _with_limits(
    found: Tier | ConfigurationError, limits: Limits | ConfigurationError | None
) -> Tier | ConfigurationError:
    if isinstance(found, ConfigurationError) or limits is None:
        return found
    return limits if isinstance(limits, ConfigurationError) else found.with_limits(limits)


def _tier_row(found: Tier | ConfigurationError) -> dict[str, Any]:
    """A tier as ``list --json`` shows it; an unreadable one with its problem and fix."""
    if isinstance(found, ConfigurationError):
        return {"tier": None, **dict.fromkeys(Tier().as_dict()), "error": str(found)}
    return {"tier": found.describe(), **found.as_dict(), "error": None}


def _shown_id(client: str) -> str:
    """The client id as the router keys it (surrounding spaces are not part of an id)."""
    return normalize_client_id(client) or client


def _shown(row: dict[str, Any]) -> str:
    return f"invalid: {row['error']}" if row["error"] is not None else str(row["tier"])


def _applies_now(router: PriorityRouter) -> str:
    """What applies to a client without a tier of its own, for a message after a change."""
    try:
        now = _tier_text(router.default_tier)
    except UNREADABLE:
        return "the default tier applies, if one is set (the store could not say)"
    return "the threshold table applies" if now == "none" else f"the default tier applies ({now})"


def _tier_text(read: Callable[[], Tier | None]) -> str:
    """A client's own or the default tier, as ``read()`` finds it, for a message: ``weight=2``,
    ``none``, ``unreadable``."""
    try:
        found = read()
    except ConfigurationError:  # stored in a form this version cannot read
        return "unreadable"
    return "none" if found is None else found.describe()
