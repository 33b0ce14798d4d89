"""Which code a benchmark measured, printed beside its figures."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def code_version() -> str:
    """The commit measured, marked ``-dirty`` when the work tree has uncommitted changes."""
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    return done.stdout.strip() or "unknown"
