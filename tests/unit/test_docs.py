"""The README stays a front page, and the site's configuration reference covers every setting."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import fields
from pathlib import Path

from priority_router import RouterConfig

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _hook() -> object:
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "docs/hooks/config_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_a_front_page() -> None:
    assert len(README.splitlines()) <= 200
    assert "make demo      # the problem and the fix" in README
    assert "make test      # unit + integration tests" in README


def test_every_page_the_readme_links_exists_and_every_page_is_linked() -> None:
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", README))
    for page in linked:
        assert (ROOT / page).is_file(), page
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} - {"docs/index.md", "docs/changelog.md"}
    assert pages <= linked, f"pages the README does not link: {sorted(pages - linked)}"


def test_the_configuration_reference_has_a_row_per_setting() -> None:
    table = _hook().reference_table()  # type: ignore[attr-defined]
    rows = table.splitlines()[2:]
    assert len(rows) == len(fields(RouterConfig))
    for f, row in zip(fields(RouterConfig), rows, strict=True):
        keyword, names, _default, meaning = (cell.strip() for cell in row.strip("|").split("|"))
        assert keyword.startswith(f"`{f.name}`")
        env, celery = names.split("<br>")
        assert celery == f"`priority_router_{f.name}`"
        assert meaning, f"{f.name} has no meaning in its field metadata"
        if f.metadata["text"] is None:
            assert env == "(Python only)"
        else:
            assert env == f"`PRIORITY_ROUTER_{f.name.upper()}`"
    assert "`1500`" in table and "`default`" in table


def test_the_configuration_page_holds_the_reference_the_fields_give() -> None:
    page = (ROOT / "docs/configuration.md").read_text()
    hook = _hook()
    assert hook.written(page) == page, "run `python docs/hooks/config_reference.py`"  # type: ignore[attr-defined]
    assert hook.reference_table() in page  # type: ignore[attr-defined]
