"""``priority-router simulate TRACE --tune``: a threshold table fitted to the trace, shown
beside plain Celery, the default table, ``wide`` and ``drr``, with the lines to paste."""

from __future__ import annotations

import json
import time
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ..simulation.fit import OBJECTIVE, SHOWN, Row, Tuning, group_waits, tune
from ..simulation.report import seconds
from ..simulation.tune import GROUPS, LIGHT_MAX, RATIOS, STARTS, TOLERANCE, Case, processors
from ..thresholds import Policy, table_name

#: Below this many documents a table runs in a few hundredths of a second, and starting
#: processes would cost more than it saves: the search runs in this one.
PARALLEL_FROM = 10_000
FAMILY = (
    f"8 limits, the first {STARTS[0]} to {STARTS[-1]}, each the one before times {RATIOS[0]} to {RATIOS[-1]}"
)
TUNE_HELP = (
    "Fit the threshold table to this trace: run every table of a family "
    f"({FAMILY}) in the counting mode of --mode, and show the one of lowest score beside the "
    "default table, wide, fifo (plain Celery) and drr (per-client round robin), by client group "
    f"(light: at most {LIGHT_MAX} documents; medium: more, and at most a tenth of the largest "
    "client's; heavy: the rest), with the lines to paste. It minimises the "
    f"{OBJECTIVE}. It recommends the simplest of the default table, wide, your --thresholds and "
    f"the tuned table within {TOLERANCE:.0%} of the lowest score. Honours --workers, --cost, "
    "--reset-interval, --max-wait, --quantum, --overhead and the tiers."
)
CAPTION = (
    "fifo: plain Celery; drr: per-client round robin, the ideal; *: recommended. Worst and "
    "median of the group's clients' p95 waits; the score is 1.0 at the bound it comes from"
)
#: How the recommendation names the tables it may recommend.
LABELS = {"default": "default table", "wide": "wide", "yours": "your table", "tuned": "tuned table"}


def paste_lines(table: Policy) -> dict[str, str]:
    """The table as each settings source takes it: ``--thresholds``, the variable, the Celery
    setting and the keyword (a name, or rows as ``parse_table`` reads them)."""
    text = table_name(table)
    return {
        "option": f"--thresholds {text}",
        "environment": f"PRIORITY_ROUTER_THRESHOLDS={text}",
        "celery": f'priority_router_thresholds = "{text}"',
        "python": f'PriorityRouter(thresholds="{text}")',
    }


def run_tune(console: Console, case: Case, current: Policy, title: str, as_json: bool) -> None:
    """Tune ``case``'s table and print what was found, as tables or as JSON."""
    jobs = processors() if len(case.trace) >= PARALLEL_FROM else 1
    started = time.perf_counter()
    with console.status("tuning: the references") as status:
        found = tune(case, current, jobs, lambda done, total: status.update(f"tuning: {done}/{total} tables"))
    took = time.perf_counter() - started
    if as_json:
        click.echo(json.dumps(as_document(found), indent=2))
        return
    console.print(tuning_table(found, title))
    console.print(f"[dim]{OBJECTIVE[0].upper()}{OBJECTIVE[1:]}.[/]", highlight=False)
    processes = f" in {jobs} processes" if jobs > 1 else ""
    if found.searched:
        console.print(f"Searched {found.searched} tables ({FAMILY}) in {took:.1f} s{processes}.")
    for note in found.notes:
        console.print(f"Note: {note}.", highlight=False)
    tuned = found.rows.get("tuned")
    if tuned is not None and tuned.table is not None:
        console.print(f"The tuned table: {table_name(tuned.table)}", highlight=False)
    console.print(f"[bold]Recommended: {LABELS[found.recommended]}[/]: {found.why}.", highlight=False)
    for line in paste_lines(found.table).values():
        console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)


def tuning_table(found: Tuning, title: str) -> Table:
    """A column per policy; a row per client group for the worst and the median of its
    clients' p95 waits, and the score."""
    shown = [found.rows[name] for name in SHOWN if name in found.rows]
    table = Table(title=title, caption=CAPTION)
    table.add_column("group: p95 wait")
    for row in shown:
        name = row.name + (" *" if row.name == found.recommended else "")
        table.add_column(name, justify="right", no_wrap=True)
    waits = [group_waits(found.base.groups, row.p95) for row in shown]
    for group in GROUPS:
        clients = found.base.groups.count(group)
        if not clients:
            continue
        table.add_row(f"{group} ({clients:,}) worst", *(seconds(_known(w[group].worst)) for w in waits))
        table.add_row("  median", *(seconds(_known(w[group].median)) for w in waits), end_section=True)
    table.add_row("score", *("" if r.verdict is None else f"{r.verdict.score:.2f}" for r in shown))
    table.add_row("  its bound", *("" if r.verdict is None else r.verdict.worst for r in shown))
    return table


def as_document(found: Tuning) -> dict[str, Any]:
    """The JSON form: the trace's groups, each policy's table, score and group waits, and the
    recommendation with its settings lines."""
    case = found.base.case
    return {
        "documents": len(case.trace),
        "clients": len(case.trace.clients),
        "workers": case.workers,
        "policy": case.policy,
        "objective": OBJECTIVE,
        "searched": found.searched,
        "policies": {name: _row_json(found, row) for name, row in found.rows.items()},
        "recommended": {
            "policy": found.recommended,
            "thresholds": table_name(found.table),
            "why": found.why,
            "settings": paste_lines(found.table),
        },
        "notes": list(found.notes),
    }


def _row_json(found: Tuning, row: Row) -> dict[str, Any]:
    return {
        "thresholds": None if row.table is None else table_name(row.table),
        "score": None if row.verdict is None else round(row.verdict.score, 6),
        "bound": None if row.verdict is None else row.verdict.worst,
        "groups": {
            group: {
                "clients": w.clients,
                "worst_p95": None if w.worst is None else round(w.worst, 6),
                "median_p95": None if w.median is None else round(w.median, 6),
            }
            for group, w in group_waits(found.base.groups, row.p95).items()
        },
    }


def _known(value: float | None) -> float:
    assert value is not None  # a group shown has clients
    return value
