"""Lines of code per concern in the package: what is left once blank lines, comments and
docstrings are gone (Lua counted the same way, ``--`` comments out).

    python scripts/loc.py            # this checkout
    python scripts/loc.py --rev REV  # the package as it was at a git revision
    python scripts/loc.py --bench    # the benchmarks instead, per script (--rev too)
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: First match wins: a file's path inside the package, by prefix.
CONCERNS = [
    (
        "gate",
        ("integration/gate.py", "integration/holding.py", "store/gate", "store/lua/gate", "store/owed.py"),
    ),
    ("simulation", ("simulation/",)),
    ("ops", ("ops/",)),
    ("demo", ("demo/",)),
    ("integration", ("integration/",)),
    ("core", ("",)),
]


def code_lines(path: str, text: str) -> int:
    if path.endswith(".lua"):
        return sum(1 for line in text.splitlines() if line.strip() and not line.strip().startswith("--"))
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            continue
        if token.type == tokenize.ENDMARKER:
            continue
        lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def files(rev: str | None, folder: str = "priority_router") -> dict[str, str]:
    if rev is None:
        return {
            str(p.relative_to(ROOT / folder)): p.read_text()
            for p in (ROOT / folder).rglob("*")
            if p.suffix in (".py", ".lua")
        }
    listed = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, f"{folder}/"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return {
        name.removeprefix(f"{folder}/"): subprocess.run(
            ["git", "show", f"{rev}:{name}"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout
        for name in listed
        if name.endswith((".py", ".lua"))
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", help="a git revision instead of the working tree")
    parser.add_argument("--bench", action="store_true", help="the benchmarks in bench/, per script")
    args = parser.parse_args()
    if args.bench:
        counts = {path: code_lines(path, text) for path, text in sorted(files(args.rev, "bench").items())}
        for path, count in counts.items():
            print(f"{path:28} {count:6}")
        print(f"{'total':28} {sum(counts.values()):6}")
        return
    totals = dict.fromkeys((name for name, _ in CONCERNS), 0)
    for path, text in files(args.rev).items():
        concern = next(name for name, prefixes in CONCERNS if path.startswith(prefixes))
        totals[concern] += code_lines(path, text)
    for name, count in totals.items():
        print(f"{name:12} {count:6}")
    print(f"{'total':12} {sum(totals.values()):6}")


if __name__ == "__main__":
    main()
