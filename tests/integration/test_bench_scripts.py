"""Every benchmark in bench/ still imports and parses its options: a tidy of the package
once moved a function a benchmark imported, and nothing noticed until the benchmark ran."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _help(script: Path) -> tuple[str, int, str]:
    done = subprocess.run(
        [sys.executable, str(script), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    return script.name, done.returncode, done.stderr[-2000:]


def test_every_benchmark_imports_and_parses_its_options() -> None:
    scripts = sorted((ROOT / "bench").glob("*.py"))
    assert len(scripts) > 10  # one script per question (#43), each with its switches
    with ThreadPoolExecutor(max_workers=4) as pool:
        failed = [(name, err) for name, code, err in pool.map(_help, scripts) if code != 0]
    assert failed == []
