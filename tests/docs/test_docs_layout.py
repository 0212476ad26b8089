"""The documentation site's code blocks fit its text column (issue 45, item 6), checked without a browser.

At a 1,400 px window the site's code column holds 102 characters of its monospace font (measured in headless
Chromium by tests/ui/test_docs_site.py, which also checks that CODE_LINE_LIMIT characters fit there); a longer
line wraps (docs/stylesheets/extra.css) and reads as two. So no line of a fenced code block in docs/ or README
(README's blocks are the site's too) is longer than CODE_LINE_LIMIT, but the one shell command that must stay a
single line: the test command, equal to .ci/run's (tests/docs/test_docs.py)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
CODE_LINE_LIMIT = 100
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)")


def code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line inside a fenced code block, without the fence's own indentation (a block
    in a list or an admonition is indented in the page, not on the site)."""
    found: list[tuple[int, str]] = []
    opening: re.Match[str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if opening is None:
            opening = match
        elif match and match["fence"].startswith(opening["fence"]) and not line.strip().strip(match["fence"][0]):
            opening = None
        else:
            indent = opening["indent"]
            found.append((number, line[len(indent):] if line.startswith(indent) else line.lstrip()))
    return found


def test_code_lines_counts_only_what_is_inside_a_fence() -> None:
    text = "intro\n\n  ```bash\n  gtep run\n    --trials 2\n  ```\nafter\n~~~\nx\n~~~\n"
    assert code_lines(text) == [(4, "gtep run"), (5, "  --trials 2"), (9, "x")]


def test_no_code_line_is_wider_than_the_sites_code_column() -> None:
    unbreakable = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    too_long = [f"{page.relative_to(ROOT)}:{number}: {len(line)} characters"
                for page in PAGES for number, line in code_lines(page.read_text())
                if len(line) > CODE_LINE_LIMIT and line.strip() != unbreakable]
    assert not too_long, (f"code lines longer than {CODE_LINE_LIMIT} characters wrap on the site at 1,400 px; "
                          "shorten or break them:\n" + "\n".join(too_long))
