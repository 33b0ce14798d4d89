"""Which code a benchmark measured, printed beside its figures."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import redis

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


def machine_line(redis_server: str) -> str:
    """The machine, its load, Python, redis-py, ``redis_server``'s version and the commit:
    a benchmark's first line, so that its figures say where they were measured."""
    version = subprocess.run([redis_server, "--version"], capture_output=True, text=True).stdout.split()[2]
    return (
        f"{platform.platform()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, "
        f"Python {platform.python_version()}, redis-py {redis.__version__}, redis-server {version}, "
        f"code {code_version()}"
    )
