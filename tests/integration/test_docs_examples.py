"""Every Python example in the README and on the site (docs/) runs, against real Redis, so
no page drifts from the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis
from support.services import broker_db_url

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = [
    (page.relative_to(ROOT).as_posix(), number, code)
    for page in PAGES
    for number, code in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S), 1)
]


def test_the_pages_have_examples() -> None:
    pages = {page for page, _, _ in EXAMPLES}
    assert {"README.md", "docs/priority.md", "docs/tiers.md", "docs/caps.md", "docs/costs.md"} <= pages
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize(
    ("page", "number", "code"), EXAMPLES, ids=[f"{page}#{number}" for page, number, _ in EXAMPLES]
)
def test_example_runs(
    page: str, number: int, code: str, redis_server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The examples use redis://localhost:6379/0, the CLI's default too: run them on the test
    # Redis's database 14 instead, in a folder of their own (some write files).
    url = broker_db_url(redis_server_url)
    monkeypatch.chdir(tmp_path)
    try:
        exec(
            compile(code.replace("redis://localhost:6379/0", url), f"{page} example {number}", "exec"),
            # A module name of its own: the tasks an example declares are named after it, and
            # Celery warns (an error here) when two examples register the same name.
            {"__name__": "docs_example_" + re.sub(r"\W", "_", page.removesuffix(".md")) + f"_{number}"},
        )
    finally:
        # An example's counts and tiers must not change the next one's priorities: clear the
        # router's keys under the prefixes it used.  Everything else the examples write is
        # deleted by the session's key sweep (tests/support/redis_sweep.py), never by name:
        # a developer's own "celery" queue may live in this database.
        prefixes = {"priority-router:", *re.findall(r'key_prefix="([^"]+)"', code)}
        client = redis.Redis.from_url(url)
        for prefix in prefixes:
            keys = list(client.scan_iter(match=prefix.replace("[", "\\[") + "*", count=500))
            if keys:
                client.delete(*keys)
