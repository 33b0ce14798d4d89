"""Compare two junit reports of Celery's integration suite: without and with the router.

usage: compare.py WITHOUT.xml WITH.xml [--broker redis|amqp] [--reruns N] [--no-rerun]

Prints the tests that pass without the router and fail (or error) with it, and the
tests that passed with the router only after the suite's ``@flaky`` marker re-ran them
while they passed at once without it (that marker re-runs on *any* failure: Celery
passes it ``cause=``, which pytest-rerunfailures ignores, so it can hide a failure).
Each such test is then run alone N times (default 5) with and N times without the
router (``run.sh BROKER [--without-router] -- NODE_ID -p no:rerunfailures``: one attempt
each), the two alternating, so that a busy spell of the machine falls on both alike; it
counts as a router regression only when it fails every time with the router and passes
every time without. A timing-sensitive test (``test_replaced_task_nesting_level_0``
fails about one run in three without the router on a loaded machine) can fail twice
in a row by chance: run back to back, two with and two without once looked like a
regression. Exit status: 1 when there is a regression, else 0 (2 for bad arguments).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
HOME = Path(os.environ.get("CELERY_SUITE_HOME", ROOT / ".celery-suite"))
FAILED = ("failed", "error")


def outcomes(path: Path) -> tuple[dict[str, str], str | None]:
    """node id -> passed/failed/error/skipped, and the broker named in the suite name."""
    result, _, broker = report(path)
    return result, broker


def report(path: Path) -> tuple[dict[str, str], dict[str, int], str | None]:
    """Outcomes, the number of attempts of each test, and the broker."""
    root = ET.parse(path).getroot()
    broker = None
    for suite in root.iter("testsuite"):
        match = re.match(r"celery-suite-(redis|amqp)-", suite.get("name", ""))
        if match:
            broker = match.group(1)
    result: dict[str, str] = {}
    attempts: dict[str, int] = {}
    for case in root.iter("testcase"):  # one per rerun attempt: the last one counts
        kinds = {child.tag for child in case}
        if "error" in kinds:
            outcome = "error"
        elif "failure" in kinds:
            outcome = "failed"
        elif "skipped" in kinds:
            outcome = "skipped"
        else:
            outcome = "passed"
        node = node_id(case.get("classname", ""), case.get("name", ""))
        result[node] = outcome
        attempts[node] = attempts.get(node, 0) + 1
    return result, attempts, broker


def node_id(classname: str, name: str) -> str:
    """``t.integration.test_canvas.test_chord`` + ``test_x`` -> a pytest node id."""
    parts = classname.split(".")
    sdists = sorted(glob.glob(str(HOME / "celery-*" / "t")))
    base = Path(sdists[-1]).parent if sdists else None
    split = min(3, len(parts))
    if base is not None:
        for i in range(len(parts), 0, -1):
            if (base / Path(*parts[:i])).with_suffix(".py").is_file():
                split = i
                break
    return "::".join(["/".join(parts[:split]) + ".py", *parts[split:], name])


def rerun(broker: str, node: str, with_router: bool, attempt: int) -> str:
    mode = "router" if with_router else "baseline"
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", node.split("/")[-1])[:80]
    tag = f"rerun-{slug}-{attempt}"
    mode_args = [] if with_router else ["--without-router"]
    cmd = [str(HERE / "run.sh"), broker, *mode_args, "--", node, "-p", "no:rerunfailures"]
    env = dict(os.environ, CELERY_SUITE_TAG=tag)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    junit = HOME / "results" / f"{broker}-{mode}-{tag}.xml"
    try:
        found, _ = outcomes(junit)
    except (OSError, ET.ParseError):
        tail = " | ".join(proc.stdout.strip().splitlines()[-3:])
        return f"no-report(rc={proc.returncode}: {tail})"
    return found.get(node, "not-run")


def alone(broker: str, node: str, reruns: int) -> tuple[list[str], list[str]]:
    """``node``'s outcomes run alone ``reruns`` times with and without the router, the
    two alternating (each pair in turn starting with the other)."""
    outcome: dict[bool, list[str]] = {True: [], False: []}
    for i in range(reruns):
        for with_router in (True, False) if i % 2 == 0 else (False, True):
            outcome[with_router].append(rerun(broker, node, with_router, i + 1))
    return outcome[True], outcome[False]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("without", type=Path, help="junit XML of the run without the router")
    parser.add_argument("with_", metavar="with", type=Path, help="junit XML of the run with the router")
    parser.add_argument("--broker", choices=("redis", "amqp"), help="default: read from the reports")
    parser.add_argument("--reruns", type=int, default=5, help="runs of each suspect per mode (default 5)")
    parser.add_argument("--no-rerun", action="store_true", help="report suspects without re-running them")
    args = parser.parse_args(argv)

    base, base_tries, broker_a = report(args.without)
    routed, routed_tries, broker_b = report(args.with_)
    broker = args.broker or broker_b or broker_a
    if broker is None:
        parser.error("cannot tell the broker from the reports: pass --broker")

    failing = sorted(n for n, o in routed.items() if o in FAILED and base.get(n) == "passed")
    retried = sorted(
        n
        for n, o in routed.items()
        if o == "passed" and routed_tries[n] > 1 and base.get(n) == "passed" and base_tries[n] == 1
    )
    suspects = failing + retried
    both = sorted(n for n, o in routed.items() if o in FAILED and base.get(n) in FAILED)
    fixed = sorted(n for n, o in routed.items() if o == "passed" and base.get(n) in FAILED)
    missing = sorted(set(base) ^ set(routed))

    print(f"broker: {broker}; without: {args.without} ({len(base)} tests)")
    print(f"with: {args.with_} ({len(routed)} tests)")
    print(f"pass without the router, fail with it: {len(failing)}")
    for node in failing:
        print(f"  {node}: without={base[node]} with={routed[node]}")
    print(f"pass at once without the router, only after @flaky re-runs with it: {len(retried)}")
    for node in retried:
        print(f"  {node}: {routed_tries[node]} attempts with the router")
    if both:
        print(f"fail in both runs (not counted): {len(both)}")
        for node in both:
            print(f"  {node}: without={base[node]} with={routed[node]}")
    if fixed:
        print(f"fail without the router, pass with it (not counted): {len(fixed)}")
        for node in fixed:
            print(f"  {node}")
    if missing:
        more = f", ... ({len(missing)} in all)" if len(missing) > 5 else ""
        print(f"in one report only (not counted): {', '.join(missing[:5])}{more}")

    if args.no_rerun:
        return 1 if suspects else 0

    regressions = []
    if suspects:
        print(f"\nre-running each suspect alone, {args.reruns}x with and {args.reruns}x without the router")
        print("(one attempt each: -p no:rerunfailures):")
    for node in suspects:
        with_router, without = alone(broker, node, args.reruns)
        confirmed = all(o in FAILED for o in with_router) and all(o == "passed" for o in without)
        verdict = "ROUTER REGRESSION" if confirmed else "not confirmed (flaky or environment)"
        print(f"  {node}")
        print(f"    with router: {', '.join(with_router)}; without: {', '.join(without)} -> {verdict}")
        if confirmed:
            regressions.append(node)

    print(f"\nrouter regressions ({broker}): {len(regressions)}")
    for node in regressions:
        print(f"  {node}")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
