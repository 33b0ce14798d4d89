"""The Celery compatibility matrix (``make matrix``): the unit and contract tests and the
integration tests marked ``compat`` against each supported Celery, each in its own
virtualenv under ``.nox/``.

Each row installs the package with that row's pins, first without its dev dependencies
(what a user's ``pip install`` gets must import the Redis transport, and ``pip check``
must pass), then with them, and runs the tests.  ``oldest`` is the floor of every range
pyproject.toml declares for Celery, kombu and redis-py; ``celery-5.X`` the newest patch
of that minor (``celery-5.5`` as a project pinned on it installs the router: its pins in a
constraints file, on RabbitMQ too); ``newest`` whatever PyPI serves now, on RabbitMQ too
(the others deselect the ``rabbitmq`` tests).  ``refused`` checks that pip refuses what pyproject.toml leaves
out.  The services are those of ``make test`` (tests/support/services.py).

``nox -s celery-5.6`` runs one row; ``nox -- -x`` passes options to pytest.  The last
session, ``table``, prints each row's last result (kept in .nox/matrix/).
"""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).parent
RESULTS = ROOT / ".nox" / "matrix"
#: Unit and contract tests, and the integration tests marked compat (tests/conftest.py).
TESTS = ("tests/unit", "tests/contract", "tests/integration")
REDIS_ONLY = "compat and not matrix and not rabbitmq"
ALL_BROKERS = "compat and not matrix"


@dataclass(frozen=True)
class Row:
    name: str
    pins: tuple[str, ...]
    markers: str = REDIS_ONLY
    why: str = ""
    #: Pins given to pip as a constraints file (``-c``), as a project that pins them does.
    constraints: tuple[str, ...] = ()

    @property
    def brokers(self) -> str:
        return "redis, amqp" if self.markers == ALL_BROKERS else "redis"


ROWS = (
    Row("oldest", ("celery==5.4.0", "kombu==5.5.2", "redis[hiredis]==6.4.0"), why="every floor"),
    Row("celery-5.4", ("celery==5.4.*",)),
    Row(
        "celery-5.5",
        (),
        markers=ALL_BROKERS,
        why="a project's pins as a constraints file; kombu 5.5, the router degraded",
        constraints=("celery==5.5.*", "kombu==5.5.*"),
    ),
    Row("celery-5.6", ("celery==5.6.*",)),
    Row("celery-5.7", ("celery==5.7.*",)),
    Row("newest", ("--upgrade", "celery", "kombu[redis]", "redis[hiredis]"), markers=ALL_BROKERS),
)
#: What pyproject.toml leaves out, each with the reason: pip must refuse to install it.
REFUSED = (
    ("celery==5.3.*", "below the floor: never tested"),
    ("celery[redis]==5.5.*", "its kombu[redis] 5.5 caps redis-py at 5.2.1, below 6.4"),
    ("kombu==5.4.*", "below Celery 5.5's floor (5.5.2): never tested"),
    ("redis==6.3.*", "kombu 5.7's Redis transport wants redis-py 6.4"),
)
#: What a user's install must import: the router, its CLI and kombu's Redis transport.
IMPORTS = "import priority_router, priority_router.ops.cli, kombu.transport.redis"


def _versions(session: nox.Session) -> dict[str, str]:
    code = (
        "import json, celery, kombu, redis; "
        "print(json.dumps({'celery': celery.__version__, 'kombu': kombu.__version__, "
        "'redis-py': redis.__version__}))"
    )
    out = session.run("python", "-c", code, silent=True)
    return json.loads(str(out).strip().splitlines()[-1])  # type: ignore[no-any-return]


def _counts(junit: Path) -> dict[str, int]:
    if not junit.exists():
        return {"passed": 0, "failed": 0, "skipped": 0}
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")  # type: ignore[assignment]
    total, failed = int(suite.get("tests", 0)), int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    skipped = int(suite.get("skipped", 0))
    return {"passed": total - failed - skipped, "failed": failed, "skipped": skipped}


def _session(row: Row) -> None:
    def run(session: nox.Session) -> None:
        started = time.monotonic()
        pins = row.pins
        if row.constraints:
            constraints = Path(session.create_tmp()) / "constraints.txt"
            constraints.write_text("\n".join(row.constraints) + "\n")
            pins = (*pins, "-c", str(constraints))
        session.install(".", *pins)
        session.run("python", "-c", IMPORTS)
        session.run("python", "-m", "pip", "check")
        session.install("-e", ".[dev]", *pins)
        versions = _versions(session)
        session.log(f"{row.name}: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
        junit = Path(session.create_tmp()) / "junit.xml"
        junit.unlink(missing_ok=True)
        tests_started = time.monotonic()
        try:
            session.run(
                "python", "-m", "pytest", *TESTS, "-m", row.markers, f"--junitxml={junit}", *session.posargs
            )
        finally:
            RESULTS.mkdir(parents=True, exist_ok=True)
            result = {
                "row": row.name,
                **versions,
                "brokers": row.brokers,
                **_counts(junit),
                "tests_s": round(time.monotonic() - tests_started),
                "total_s": round(time.monotonic() - started),
                "at": time.strftime("%Y-%m-%d %H:%M"),
            }
            (RESULTS / f"{row.name}.json").write_text(json.dumps(result) + "\n")

    run.__doc__ = f"{', '.join(row.pins + row.constraints)}; brokers: {row.brokers}" + (
        f" ({row.why})" if row.why else ""
    )
    nox.session(name=row.name)(run)


for _row in ROWS:
    _session(_row)


@nox.session
def refused(session: nox.Session) -> None:
    """pip refuses the releases pyproject.toml leaves out."""
    # An older pip backtracks into ancient source distributions and fails building one.
    session.install("--upgrade", "pip")
    for pin, why in REFUSED:
        session.log(f"{pin}: must be refused ({why})")
        out = session.run(
            "python", "-m", "pip", "install", "--dry-run", ".", pin, success_codes=[1], silent=True
        )
        said = str(out)
        if "ResolutionImpossible" not in said or "priority-router" not in said:
            session.error(f"{pin}: pip failed otherwise than by refusing:\n{said[-3000:]}")
        session.log(
            next((line for line in said.splitlines() if "priority-router" in line and "depends" in line), "")
        )


@nox.session(python=False)
def table(session: nox.Session) -> None:
    """Each row's last result, as a Markdown table."""
    columns = ("row", "celery", "kombu", "redis-py", "brokers", "passed", "failed", "skipped")
    columns += ("tests_s", "total_s")
    lines = ["| " + " | ".join(columns) + " | at |", "|" + " --- |" * (len(columns) + 1)]
    for row in ROWS:
        path = RESULTS / f"{row.name}.json"
        if path.exists():
            data = json.loads(path.read_text())
            lines.append("| " + " | ".join(str(data[c]) for c in (*columns, "at")) + " |")
    print("\n".join(lines))
