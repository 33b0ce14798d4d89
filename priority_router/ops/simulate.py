"""``priority-router simulate``: compare queue policies on a trace, without a broker or Redis.

    priority-router simulate trace.csv --workers 16
    priority-router simulate --workload noisy-neighbour --workers 8 --max-wait 1 --plot waits.png
    priority-router simulate trace.csv --policies fifo,seed,drr --json
    priority-router simulate trace.csv --tier importer=weight=4 --tier partner=shift=-1 --default-tier shift=1
    priority-router simulate --workload mixed-sizes --cost duration
    priority-router simulate --workload slow-neighbour --tier heavy=max_in_flight=3,borrow
    priority-router simulate trace.csv --workers 16 --tune --mode inflight

The router's settings come from the options, else from ``PRIORITY_ROUTER_*`` variables
(and the group's ``--reset-interval`` and ``--mode``), as the other commands read them.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from click.core import ParameterSource
from rich.console import Console
from rich.markup import escape

from ..config import MODES, RouterConfig
from ..errors import ConfigurationError
from ..limits import Limits
from ..simulation.compare import compare
from ..simulation.costs import MAX_COST
from ..simulation.gate import GATE_TICK
from ..simulation.policies import EVERY_POLICY, POLICIES
from ..simulation.report import (
    PlotUnavailable,
    as_json,
    check_plot,
    groups_table,
    limits_table,
    plot,
    policy_table,
    summary_table,
)
from ..simulation.tiers import Tiers, TierSpecError, load_tiers_csv, parse_client_tier, parse_tier
from ..simulation.trace import BASES, Trace, TraceError, counted_by, load_csv
from ..simulation.tune import Case
from ..simulation.workloads import DEFAULT_SEED, WORKLOADS
from ..thresholds import DEFAULT_THRESHOLDS, Policy, parse_table, rows_text, table_name
from ..tiers import Tier
from .simulate_tune import TUNE_HELP, run_tune

THRESHOLDS_HELP = (
    "The threshold table: a name, default (the scheme's table, "
    + rows_text(DEFAULT_THRESHOLDS)
    + ") or wide (a deeper one, for several heavy clients), or LIMIT:PRIORITY rows, lowest "
    "limit first, priority applying when pending < LIMIT, with an optional fallback:PRIORITY "
    "for counts under no limit (default 1) [PRIORITY_ROUTER_THRESHOLDS, default]."
)
BOUNDED = tuple(p for p in POLICIES if p.endswith("+max_wait"))
#: The policies tiers apply to: the router's; fifo, rr and drr have no priorities.
TIERED = tuple(p for p in POLICIES if p.startswith(("seed", "inflight")))
COST_HELP = (
    "What each document counts for in the router's policies, and what drr shares by: column: "
    "the trace's cost column (1 without one); duration: its seconds (the expected seconds a "
    "publisher would pass); document: 1 each."
)
#: How the tables' heading names what was counted, when it is not 1 per document.
COUNTED = {"column": "cost: the cost column", "duration": "cost: seconds (--cost duration)"}
TIER_HELP = (
    "A client's tier, as `priority-router tier set` stores it: CLIENT=weight=W,shift=S or "
    "CLIENT=fixed=P for the router's policies, with or without limits for every policy "
    "(max_in_flight=N, max_cost_in_flight=C, borrow, rate=R/s|R/m|R/h, burst=B), e.g. "
    "bulk=weight=2,max_in_flight=3; or CLIENT=neutral (exempt from --default-tier). "
    "Repeatable; wins over --tiers."
)


def _thresholds(ctx: click.Context, param: click.Parameter, value: str | None) -> Policy | None:
    if value is None:
        return None
    try:
        return parse_table(value)
    except ConfigurationError as exc:
        raise click.BadParameter(f"{exc.problem}. Fix: {exc.fix}", ctx, param) from None


def _policies(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = tuple(dict.fromkeys(p.strip() for p in value.split(",") if p.strip()))
    unknown = [p for p in names if p not in EVERY_POLICY]
    if unknown or not names:
        raise click.BadParameter(
            f"{', '.join(unknown) or 'nothing'} is not a policy; use a comma list of "
            + ", ".join(EVERY_POLICY),
            ctx,
            param,
        )
    return names


def _client_tiers(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> dict[str, Tier]:
    found: dict[str, Tier] = {}
    for text in value:
        try:
            client, tier = parse_client_tier(text)
        except TierSpecError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
        if client in found:
            raise click.BadParameter(f"{client!r} is given twice; give each client one --tier", ctx, param)
        found[client] = tier
    return found


def _default_tier(ctx: click.Context, param: click.Parameter, value: str | None) -> Tier | None:
    if value is None:
        return None
    try:
        tier = parse_tier(value)
    except TierSpecError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
    if tier == Tier():
        raise click.BadParameter(
            "a neutral default tier changes nothing; leave --default-tier out", ctx, param
        )
    return tier


def _tiers_file(ctx: click.Context, param: click.Parameter, value: Path | None) -> dict[str, Tier]:
    if value is None:
        return {}
    try:
        return load_tiers_csv(value)
    except TierSpecError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


@click.command()
@click.argument("trace", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--workload",
    type=click.Choice(list(WORKLOADS)),
    help="Simulate a built-in workload (the benchmarks' own, and mixed-sizes for costs) instead "
    "of a TRACE file.",
)
@click.option("--seed", type=int, help=f"Seed of a built-in workload's document lengths [{DEFAULT_SEED}].")
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Worker slots (processes x threads).",
)
@click.option("--thresholds", callback=_thresholds, metavar="NAME|ROWS", help=THRESHOLDS_HELP)
@click.option(
    "--reset-interval",
    type=float,
    help="Idle seconds before a client's count resets [PRIORITY_ROUTER_RESET_INTERVAL, 1500].",
)
@click.option(
    "--max-wait",
    type=float,
    help="Seconds after which a waiting document goes first, for the +max_wait policies "
    "[PRIORITY_ROUTER_MAX_WAIT; without it those policies are left out].",
)
@click.option(
    "--policies",
    callback=_policies,
    help=f"Comma list of policies to compare, of {', '.join(EVERY_POLICY)} [all but rr; rr too "
    "when documents have costs].",
)
@click.option("--cost", type=click.Choice(BASES), default=BASES[0], show_default=True, help=COST_HELP)
@click.option(
    "--quantum",
    type=float,
    help="DRR quantum, in cost when documents have costs, else in seconds [the largest cost, or "
    "the longest document].",
)
@click.option(
    "--tier", "client_tiers", multiple=True, callback=_client_tiers, metavar="CLIENT=TIER", help=TIER_HELP
)
@click.option(
    "--default-tier",
    callback=_default_tier,
    metavar="TIER",
    help="The tier of every client without one of its own, e.g. shift=1, fixed=9 or "
    "max_in_flight=2 (`priority-router tier set --default`).",
)
@click.option(
    "--tiers",
    "tiers_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    callback=_tiers_file,
    metavar="FILE.csv",
    help="Clients' tiers from a CSV file client_id,weight,shift,fixed, optionally followed by "
    "any of max_in_flight,borrow,rate,burst,max_cost_in_flight (an empty cell: not set).",
)
@click.option(
    "--gate-tick",
    type=click.FloatRange(min=0, min_open=True),
    default=GATE_TICK,
    show_default=True,
    help="Seconds between the workers' gate ticks, which release documents held for a rate, "
    "or to borrow idle slots.",
)
@click.option(
    "--overhead",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds a slot spends fetching and acknowledging each document before it starts.",
)
@click.option("--json", "as_json_flag", is_flag=True, help="Print only the JSON document.")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    metavar="FILE.png",
    help="Write a chart of each client group's waits per policy (needs the 'plot' extra).",
)
@click.option(
    "--clients", type=click.IntRange(min=1), default=20, show_default=True, help="Most rows per policy table."
)
@click.option("--tune", is_flag=True, help=TUNE_HELP)
@click.option(
    "--mode",
    type=click.Choice(MODES),
    help="With --tune: the counting mode to fit the table to [PRIORITY_ROUTER_MODE, seed].",
)
@click.pass_context
def simulate(
    ctx: click.Context,
    trace: Path | None,
    workload: str | None,
    seed: int | None,
    workers: int,
    thresholds: Policy | None,
    reset_interval: float | None,
    max_wait: float | None,
    policies: tuple[str, ...] | None,
    cost: str,
    quantum: float | None,
    client_tiers: dict[str, Tier],
    default_tier: Tier | None,
    tiers_file: dict[str, Tier],
    gate_tick: float,
    overhead: float,
    as_json_flag: bool,
    plot_path: Path | None,
    clients: int,
    tune: bool,
    mode: str | None,
) -> None:
    """Compare queue policies on TRACE (a CSV file timestamp,client_id,duration[,cost]) or a --workload.

    Simulates FIFO (plain Celery), the router's seed and inflight modes (each also with
    --max-wait), counting each document by its cost, and round robin over clients, per
    document (rr) and by cost (drr): the ideals no broker offers.  With the router's own
    threshold table and tiers, it shows each client's p50/p95/max wait, the makespan and
    Jain's index of the clients' slowdowns.  No broker, no Redis.

    With --tune, it fits a threshold table to the trace instead, and shows how (see --tune).
    """
    if (trace is None) == (workload is None):
        raise click.UsageError("give a TRACE file or --workload NAME (one of them)")
    if seed is not None and workload is None:
        raise click.BadParameter(
            "sets a built-in workload's document lengths; a TRACE file has its own", ctx, param_hint="--seed"
        )
    if quantum is not None and not quantum > 0:
        raise click.BadParameter(
            f"{quantum!r} is not a positive number (of seconds, or of cost when documents have costs)",
            ctx,
            param_hint="--quantum",
        )
    if tune:
        _check_tune(ctx)
    elif mode is not None:
        raise click.UsageError(
            "--mode is the counting mode --tune fits a table to; without --tune every policy "
            "runs, both modes among them: choose them with --policies"
        )
    config = _config(ctx, reset_interval, max_wait, thresholds, mode)
    tiers = Tiers({**tiers_file, **client_tiers}, default_tier)
    if tiers and not config.tiers:
        raise click.UsageError(
            "PRIORITY_ROUTER_TIERS turns tiers off, as it does in the router; unset it to simulate "
            "--tier, --default-tier or --tiers"
        )
    if plot_path is not None:
        try:
            check_plot(plot_path)
        except PlotUnavailable as exc:
            raise click.UsageError(str(exc)) from None

    source = trace.name if trace is not None else f"workload {workload}"
    loaded = _counted(_load(trace, workload, DEFAULT_SEED if seed is None else seed), cost)
    console = Console(stderr=as_json_flag)
    size = f"{len(loaded)} documents, {len(loaded.clients)} clients, {workers} workers"
    settings = _settings(config, overhead, tiers, gate_tick, loaded, cost)
    if tune:
        case = Case(
            source,
            loaded,
            workers,
            mode=config.mode,
            reset_interval=config.reset_interval,
            max_wait=config.max_wait,
            quantum=quantum,
            overhead=overhead,
            tiers=tiers or None,
            gate_tick=gate_tick,
        )
        if tiers:
            _tier_notes(console, tiers, loaded, ("fifo", case.policy, "drr"))
        title = f"{source}: {size}; tuning the table for {case.policy}; {settings}"
        run_tune(console, case, config.thresholds, title, as_json_flag)
        return
    chosen = _chosen(policies, config, bool(loaded.cost_units))
    if not as_json_flag and policies is None and config.max_wait is None:
        console.print(f"[dim]{' and '.join(BOUNDED)} need --max-wait SECONDS: left out[/]")
    if tiers:
        _tier_notes(console, tiers, loaded, chosen)
    with console.status("simulating") as status:
        outcomes = compare(
            loaded,
            chosen,
            config,
            workers,
            quantum,
            progress=lambda name: status.update(f"simulating {name}"),
            overhead=overhead,
            tiers=tiers or None,
            gate_tick=gate_tick,
        )
    if plot_path is not None:
        plot(outcomes, loaded, plot_path, f"{source}: {workers} workers")
    if as_json_flag:
        click.echo(json.dumps(as_json(outcomes), indent=2))
        return
    console.print(summary_table(outcomes, f"{source}: {size}; {settings}"))
    console.print(groups_table(outcomes, loaded))
    limited = _limited(tiers, loaded)
    if limited:
        console.print(limits_table(outcomes, limited, clients))
    for outcome in outcomes.values():
        console.print(policy_table(outcome, loaded, clients))
    if plot_path is not None:
        console.print(f"Chart: {plot_path}", soft_wrap=True)


def _settings(
    config: RouterConfig, overhead: float, tiers: Tiers, gate_tick: float, loaded: Trace, cost: str
) -> str:
    """The settings line of the tables' heading: what differs from a plain replay."""
    return (
        f"reset_interval {config.reset_interval:g} s"
        + ("" if config.max_wait is None else f", max_wait {config.max_wait:g} s")
        + ("" if config.thresholds == DEFAULT_THRESHOLDS else f", thresholds {table_name(config.thresholds)}")
        + ("" if not overhead else f", overhead {overhead * 1000:g} ms per document")
        + ("" if not tiers else f", {tiers.summary()}")
        + ("" if not tiers.limiting else f", gate tick {gate_tick:g} s")
        + ("" if not loaded.cost_units else f", {COUNTED[cost]}")
    )


def _check_tune(ctx: click.Context) -> None:
    """--tune shows its own policies, by client group: refuse the options it would ignore."""
    ignored = {"policies": "--policies", "plot_path": "--plot", "clients": "--clients"}
    given = [
        option
        for name, option in ignored.items()
        if ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE
    ]
    if given:
        raise click.UsageError(
            f"--tune compares its own policies (fifo, the router's in --mode, drr) by client group, "
            f"so it takes no {' or '.join(given)}; replay the table it recommends with "
            "`simulate TRACE --thresholds ROWS` and those options to see every policy, client or chart"
        )


def _tier_notes(console: Console, tiers: Tiers, loaded: Trace, chosen: tuple[str, ...]) -> None:
    """Warn about tiers that change nothing: for clients not in the trace, or policies without priorities."""
    missing = tiers.missing(loaded.clients)
    if missing:
        shown = ", ".join(repr(c) for c in missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        hint = " (the default tier is --default-tier TIER)" if "default" in missing else ""
        console.print(
            f"[yellow]tiers for client(s) not in the trace change nothing: {escape(shown)}{hint}[/]"
        )
    ignoring = [p for p in chosen if p not in TIERED]
    if ignoring and tiers.prioritizing:
        verb = "ignores" if len(ignoring) == 1 else "ignore"
        names = ", ".join(ignoring[:-1]) + " and " + ignoring[-1] if len(ignoring) > 1 else ignoring[0]
        note = "tiers (no priorities)"
        if tiers.limiting:
            note = "tiers' priorities (no priorities; limits apply)"
        console.print(f"[dim]{names} {verb} {note}[/]")


def _limited(tiers: Tiers, loaded: Trace) -> dict[str, Limits]:
    """Each client of the trace with limits, and its limits."""
    found = tiers.limits_of(loaded.clients)
    if found is None:
        return {}
    return {c: lim for c, lim in zip(loaded.clients, found, strict=True) if lim}


def _config(
    ctx: click.Context,
    reset_interval: float | None,
    max_wait: float | None,
    thresholds: Policy | None,
    mode: str | None = None,
) -> RouterConfig:
    if ctx.parent is not None:
        # The group's options: `priority-router --mode inflight simulate TRACE --tune`.
        reset_interval = ctx.parent.params.get("reset_interval") if reset_interval is None else reset_interval
        mode = ctx.parent.params.get("mode") if mode is None else mode
    try:
        return RouterConfig.from_env(
            None, reset_interval=reset_interval, max_wait=max_wait, thresholds=thresholds, mode=mode
        )
    except ConfigurationError as exc:
        option = {"reset_interval": "--reset-interval", "max_wait": "--max-wait"}.get(exc.setting)
        if option is None:
            raise click.UsageError(str(exc), ctx) from None
        raise click.BadParameter(f"{exc.problem}. Fix: {exc.fix}", ctx, param_hint=option) from None


def _chosen(policies: tuple[str, ...] | None, config: RouterConfig, costed: bool) -> tuple[str, ...]:
    if policies is None:
        # With every cost 1, drr shares by seconds and rr stays out, as before costs.
        shown = EVERY_POLICY if costed else POLICIES
        return tuple(p for p in shown if config.max_wait is not None or p not in BOUNDED)
    needing = [p for p in policies if p in BOUNDED]
    if needing and config.max_wait is None:
        raise click.BadParameter(
            f"{', '.join(needing)} need a max_wait: add --max-wait SECONDS (or set PRIORITY_ROUTER_MAX_WAIT)",
            param_hint="--policies",
        )
    return policies


def _counted(loaded: Trace, cost: str) -> Trace:
    try:
        return counted_by(loaded, cost)
    except TraceError:
        raise click.BadParameter(
            f"a document lasts more than {MAX_COST:,} s, the largest cost the router counts; "
            "count by the cost column or by document",
            param_hint="--cost",
        ) from None


def _load(trace: Path | None, workload: str | None, seed: int) -> Trace:
    if trace is None:
        assert workload is not None
        return WORKLOADS[workload](seed).trace()
    try:
        return load_csv(trace)
    except TraceError as exc:
        raise click.BadParameter(str(exc), param_hint="TRACE") from None
