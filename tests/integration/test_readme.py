"""Every Python example in the README runs, against real Redis (so the docs cannot rot)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.services import broker_db_url

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_examples() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int, redis_server_url: str) -> None:
    # The examples use redis://localhost:6379/0, the CLI's default too: run them on the test
    # Redis's database 14 instead.
    code = BLOCKS[index]
    code = code.replace("redis://localhost:6379/0", broker_db_url(redis_server_url))
    # What the examples write is deleted by the session's key sweep (tests/support/redis_sweep.py),
    # never by name: a developer's own "celery" queue may live in this database.
    exec(compile(code, f"README.md example {index + 1}", "exec"), {"__name__": f"readme_{index}"})
