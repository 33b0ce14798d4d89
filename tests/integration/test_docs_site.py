"""The site builds (``make docs``: mkdocs --strict), and a broken link fails the build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=root,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The repository's site sources, where a test may break them."""
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copytree(ROOT / "docs", root / "docs")
    for name in ("mkdocs.yml", "CHANGELOG.md", "README.md"):
        shutil.copy(ROOT / name, root / name)
    return root


def test_the_site_builds_without_a_warning(copy: Path, tmp_path: Path) -> None:
    built = _build(copy, tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "architecture" / "index.html").is_file()
    assert "priority_router.PriorityRouter.record" in (tmp_path / "site" / "api" / "index.html").read_text()


@pytest.mark.parametrize(
    "breakage",
    ["[a page](no-such-page.md)", "[an anchor](caps.md#no-such-anchor)"],
)
def test_a_broken_link_fails_the_build(copy: Path, tmp_path: Path, breakage: str) -> None:
    page = copy / "docs" / "limitations.md"
    page.write_text(page.read_text() + f"\nSee {breakage}.\n")
    built = _build(copy, tmp_path / "site")
    assert built.returncode != 0
    assert "WARNING" in built.stderr and "limitations.md" in built.stderr
