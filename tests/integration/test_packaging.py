"""What a user's ``pip install priority-router`` gets: the library and nothing foreign."""

from __future__ import annotations

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
