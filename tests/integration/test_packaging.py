"""What a user's ``pip install priority-router`` gets: the library and nothing foreign."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_the_wheel_ships_priority_router_only(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("priority_router-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"priority_router", wheel.name.split("-py")[0] + ".dist-info"}, tops
    assert "priority_router/py.typed" in names
    assert "priority_router/integration/lua/promote.lua" in names, "max_wait's script is package data"
    # `priority-router demo` runs from the wheel: its workers' app and task are in the package.
    assert {"priority_router/demo/run.py", "priority_router/demo/worker.py"} <= set(names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "priority-router = priority_router.ops.cli:main" in text


@pytest.mark.integration
def test_a_project_pinned_on_celery_5_5_keeps_its_pins(tmp_path: Path) -> None:
    """What a project pinned on Celery 5.5 (and so kombu 5.5) gets from ``pip install``,
    its pins in a constraints file: its pins kept, the router installable beside them."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # An older pip backtracks into ancient source distributions instead of refusing.
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    subprocess.run([*pip, "install", "--quiet", "--upgrade", "pip"], check=True, timeout=300)
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("celery==5.5.3\nkombu==5.5.4\n")
    report = tmp_path / "report.json"
    install = [str(venv / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--quiet"]
    subprocess.run(
        [*install, "--report", str(report), str(ROOT), "-c", str(constraints)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    got = {
        i["metadata"]["name"].lower(): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    assert (got["celery"], got["kombu"]) == ("5.5.3", "5.5.4"), got
    assert "priority-router" in got

    # celery[redis] 5.5's kombu caps redis-py at 5.2.1: refused, naming the router's floor.
    refused = subprocess.run(
        [*install[:-1], str(ROOT), "celery[redis]==5.5.3"], capture_output=True, text=True, timeout=600
    )
    assert refused.returncode == 1
    assert (
        "priority-router" in refused.stdout + refused.stderr
        and "redis>=6.4" in refused.stdout + refused.stderr
    )
