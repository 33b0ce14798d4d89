"""The configuration reference, written from RouterConfig's own fields.

``docs/configuration.md`` holds the table between two marker lines, so that it reads on
GitHub as well as on the site.  ``python docs/hooks/config_reference.py`` writes it anew
after a setting changes; as an mkdocs hook, this module fails the site's build when the
page's table is not the one the fields give (and ``tests/unit/test_docs.py`` fails too).
Each row: the setting (its constructor keyword), its environment variable and Celery
setting, its default and its meaning, all read from the field's metadata.
"""

from __future__ import annotations

import re
import sys
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from priority_router.config import CELERY_PREFIX, ENV_PREFIX, RouterConfig

PAGE = Path(__file__).resolve().parents[1] / "configuration.md"
BEGIN = "<!-- config-reference: written by `python docs/hooks/config_reference.py`; do not edit -->"
END = "<!-- end of config-reference -->"


def reference_table() -> str:
    rows = [
        "| setting: the constructor keyword | environment variable<br>Celery setting | default | meaning |",
        "|---|---|---|---|",
    ]
    for position, f in enumerate(fields(RouterConfig)):
        keyword = f"`{f.name}`" if position else f"`{f.name}`<br>(or the first positional argument)"
        env = f"`{ENV_PREFIX}{f.name.upper()}`" if f.metadata["text"] is not None else "(Python only)"
        rows.append(
            f"| {keyword} | {env}<br>`{CELERY_PREFIX}{f.name}` "
            f"| {_default(f.default, f.metadata['shown'])} | {f.metadata['meaning']} |"
        )
    return "\n".join(rows)


def _default(value: Any, shown: str | None) -> str:
    if shown is not None:
        return f"`{shown}`"
    if value is MISSING or value is None:
        return "None"
    if isinstance(value, float) and value.is_integer():
        return f"`{value:g}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value!r}`"


def written(page: str) -> str:
    """``page`` with the table between its markers as the fields give it now."""
    pattern = re.compile(re.escape(BEGIN) + r"\n(?:.*?\n)?" + re.escape(END), flags=re.S)
    if not pattern.search(page):
        raise ValueError(f"{PAGE.name} has no {BEGIN!r} ... {END!r} block")
    return pattern.sub(lambda _: f"{BEGIN}\n{reference_table()}\n{END}", page)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri == PAGE.name and written(markdown) != markdown:
        raise SystemExit(
            f"docs/{PAGE.name}'s configuration reference is not RouterConfig's: "
            "run `python docs/hooks/config_reference.py` and commit the page"
        )
    return markdown


if __name__ == "__main__":
    text = PAGE.read_text()
    new = written(text)
    PAGE.write_text(new)
    sys.stdout.write(f"{PAGE}: {'written anew' if new != text else 'already current'}\n")
