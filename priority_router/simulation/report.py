"""What ``simulate`` shows: rich tables, the JSON document and the plot."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.table import Table

from ..limits import Limits
from .metrics import Outcome, group_order, group_waits, p95
from .trace import Trace

#: The extra that brings matplotlib, as a user installs it.
PLOT_EXTRA = "pip install 'priority-router[plot]'"


class PlotUnavailable(RuntimeError):
    """``--plot`` cannot be honoured; the message says why and what to do."""


def seconds(value: float) -> str:
    """A duration for people: ms below a second, then s, min, h."""
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.2f} s"
    if value < 3600:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def summary_table(outcomes: dict[str, Outcome], title: str) -> Table:
    """One row per policy: makespan, Jain's index, the waits of every document, and the
    documents that started before one their client published earlier."""
    table = Table(title=title)
    for column in ("policy", "makespan", "Jain", "p50 wait", "p95 wait", "max wait", "overtakes"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for name, outcome in outcomes.items():
        waits = outcome.waits
        table.add_row(
            name,
            seconds(outcome.makespan),
            f"{outcome.jain:.3f}",
            *(seconds(v) for v in (statistics.median(waits), p95(waits), max(waits))),
            f"{outcome.overtakes:,}",
        )
    return table


def groups_table(outcomes: dict[str, Outcome], trace: Trace) -> Table:
    """Each client group's document waits under each policy, lighter groups first."""
    table = Table(title="Waits by client group")
    for column in ("group", "clients", "policy", "p50 wait", "p95 wait", "max wait"):
        table.add_column(column, justify="left" if column in ("group", "policy") else "right")
    grouped = {name: group_waits(trace, o.waits) for name, o in outcomes.items()}
    groups = group_order(trace)
    for g in groups:
        clients = str(sum(1 for group in trace.groups if group == g))
        for i, name in enumerate(outcomes):
            waits = grouped[name][g]
            table.add_row(
                g if i == 0 else "",
                clients if i == 0 else "",
                name,
                *(seconds(v) for v in (statistics.median(waits), p95(waits), max(waits))),
                end_section=i == len(outcomes) - 1 and g != groups[-1],
            )
    return table


def policy_table(outcome: Outcome, trace: Trace, limit: int) -> Table:
    """One row per client (at most ``limit``: the longest p95 waits when there are more)."""
    per_client = outcome.per_client
    shown, caption = _most(per_client, limit, lambda c: per_client[c].p95_wait, "with the longest p95 wait")
    table = Table(
        title=f"{outcome.policy}: makespan {seconds(outcome.makespan)}, Jain {outcome.jain:.3f}",
        caption=caption,
    )
    group_of = dict(zip(trace.clients, trace.groups, strict=True))
    columns = ["client", "group", "documents", "p50 wait", "p95 wait", "max wait"]
    ordered = outcome.overtakes == 0
    if not ordered:
        columns.append("overtakes")
    for column in columns:
        table.add_column(column, justify="left" if column in ("client", "group") else "right")
    for client_id in shown:
        w = per_client[client_id]
        table.add_row(
            client_id,
            group_of[client_id],
            str(w.documents),
            *(seconds(v) for v in (w.p50_wait, w.p95_wait, w.max_wait)),
            *(() if ordered else (f"{w.overtakes:,}",)),
        )
    return table


def limits_table(outcomes: dict[str, Outcome], limits: Mapping[str, Limits], limit: int) -> Table:
    """Each client with limits under each policy: the most documents it ran at once, its
    documents held and their time held (at most ``limit`` clients: the longest held)."""
    held = {c: max(o.gated[c].held_seconds for o in outcomes.values()) for c in limits}
    clients, caption = _most(limits, limit, held.__getitem__, "held longest")
    table = Table(title="Limits: what the workers' gate did", caption=caption)
    for column in ("client", "limits", "policy", "max running", "held", "time held"):
        table.add_column(column, justify="left" if column in ("client", "limits", "policy") else "right")
    for n, client_id in enumerate(clients):
        for i, (name, outcome) in enumerate(outcomes.items()):
            stats = outcome.gated[client_id]
            table.add_row(
                client_id if i == 0 else "",
                limits[client_id].describe() if i == 0 else "",
                name,
                str(stats.peak),
                str(stats.held),
                seconds(stats.held_seconds),
                end_section=i == len(outcomes) - 1 and n != len(clients) - 1,
            )
    return table


def _most(
    clients: Iterable[str], limit: int, key: Callable[[str], float], what: str
) -> tuple[list[str], str | None]:
    """Every client, by id, or when there are more than ``limit``, the ``limit`` with the
    largest ``key`` (ties by id), and the caption then saying which (``what``)."""
    found = sorted(clients)
    if len(found) <= limit:
        return found, None
    found.sort(key=lambda c: -key(c))  # stable: ties stay in id order
    return found[:limit], f"the {limit} clients {what} of {len(found)}; --json lists every client"


def as_json(outcomes: dict[str, Outcome]) -> dict[str, Any]:
    """policy -> {"makespan", "jain", "overtakes", "per_client": {client: {"documents",
    "p50_wait", "p95_wait", "max_wait", "overtakes"}}}, seconds rounded to the microsecond; with limits, also
    "limits": {client: {"max_running", "held", "held_seconds"}} for each client with limits."""
    return {name: _policy_json(o) for name, o in outcomes.items()}


def _policy_json(o: Outcome) -> dict[str, Any]:
    found: dict[str, Any] = {
        "makespan": round(o.makespan, 6),
        "jain": round(o.jain, 6),
        "overtakes": o.overtakes,
        # A client's entry is its ClientWaits, field for field (round leaves the counts whole).
        "per_client": {c: {k: round(v, 6) for k, v in asdict(w).items()} for c, w in o.per_client.items()},
    }
    if o.gated:
        found["limits"] = {
            client_id: {
                "max_running": g.peak,
                "held": g.held,
                "held_seconds": round(g.held_seconds, 6),
            }
            for client_id, g in o.gated.items()
        }
    return found


def check_plot(path: Path) -> str:
    """The image format for ``path``; :class:`PlotUnavailable` when matplotlib is missing
    or does not write that format.  Called before simulating, so a run is not wasted."""
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable(f"--plot needs matplotlib; install it with {PLOT_EXTRA}") from None
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    folder = path.parent
    if not folder.is_dir():
        raise PlotUnavailable(
            f"--plot {str(path)!r}: the folder {str(folder)!r} does not exist; create it, or write "
            "the chart somewhere that exists"
        )
    kind = path.suffix.lstrip(".").lower()
    supported = Figure().canvas.get_supported_filetypes()
    if kind not in supported:
        raise PlotUnavailable(
            f"--plot {str(path)!r}: matplotlib writes no {kind or 'extension-less'!r} files; "
            f"end the name with .png (or one of {', '.join('.' + k for k in sorted(supported))})"
        )
    return kind


def plot(outcomes: dict[str, Outcome], trace: Trace, path: Path, title: str) -> None:
    """Each group's waits under each policy, one panel per group; written whole or not at all."""
    kind = check_plot(path)
    from matplotlib.figure import Figure

    groups = group_order(trace)
    fig = Figure(figsize=(max(6.0, 1.1 * len(outcomes) * len(groups) + 1.5), 4.8), dpi=110)
    axes = fig.subplots(1, len(groups), sharey=True, squeeze=False)[0]
    linthresh = max(1e-3, statistics.median(trace.duration))
    grouped = {name: group_waits(trace, o.waits) for name, o in outcomes.items()}
    names = list(outcomes)
    for ax, group in zip(axes, groups, strict=True):
        data = [grouped[name][group] for name in names]
        ax.boxplot(data, whis=(5, 95), showfliers=False)
        ax.set_xticks(range(1, len(names) + 1), names)
        ax.scatter(range(1, len(names) + 1), [max(d) for d in data], marker="x", color="tab:red", label="max")
        clients = sum(1 for g in trace.groups if g == group)
        ax.set_title(f"{group} ({clients} client{'s' if clients != 1 else ''})")
        ax.set_yscale("symlog", linthresh=linthresh)
        ax.tick_params(axis="x", labelrotation=30)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("wait before start (s)\nbox p25-p75, whiskers p5-p95")
    axes[0].legend(loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            fig.savefig(f, format=kind)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
