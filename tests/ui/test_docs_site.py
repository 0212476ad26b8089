"""The documentation site in a real browser at 1,400 x 900 (issue 45, item 6): no table and no code block runs
past the text column, and every table's last column is in view.

Group `ui` (pytest -m ui; tests/ui/with-chromium.sh installs Debian's chromium and chromium-driver when they are
missing, this test installs nothing). The site is built with `mkdocs build` into a temporary folder and served on
127.0.0.1 by Python's http.server; headless Chromium, driven by Selenium, opens every page. Screenshots of the
pages with the widest tables and the longest code blocks go to the test's tmp folder and to test-artifacts/ui/
(ignored by git): docs-benchmarks.png (the reference comparison), docs-fluid.png (the nine-column FLUID table
of docs/benchmarks.md and the FLUID page), docs-layout.png (the layout's code block).
"""
from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.docs.test_docs_layout import CODE_LINE_LIMIT
from tests.ui.browser import headless_chromium

pytestmark = pytest.mark.ui

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "ui"
WINDOW = (1400, 900)
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  f"--window-size={WINDOW[0]},{WINDOW[1]}",
                  # the theme asks Google for its fonts; offline, each page would wait for that request to time out
                  "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
# (screenshot, page, text of the table or code block to scroll to)
SHOTS = [("docs-benchmarks.png", "benchmarks/", "foster (PyCIL's student)"),
         ("docs-fluid.png", "benchmarks/", "fluid_imprinting"),
         ("docs-layout.png", "layout/", "gtep/orchestration")]

# What runs past its box, page by page: tables' scroll wrappers (Material puts a wide table in one, with a
# horizontal scrollbar: the hidden columns), tables whose last column ends right of the text column or the window,
# and code blocks wider than their box. Each entry says what it is and by how much.
OVERFLOWS_JS = """
const content = document.querySelector('.md-content__inner').getBoundingClientRect();
const right = Math.min(content.right, window.innerWidth);
const out = [];
for (const wrap of document.querySelectorAll('.md-typeset__scrollwrap')) {
  if (wrap.scrollWidth > wrap.clientWidth + 1)
    out.push(`table scrolls: ${wrap.scrollWidth} px in ${wrap.clientWidth} px: ${wrap.innerText.slice(0, 60)}`);
}
for (const table of document.querySelectorAll('.md-typeset table')) {
  const cells = table.rows[0].cells, last = cells[cells.length - 1].getBoundingClientRect();
  if (last.right > right + 1)
    out.push(`last column ends at ${Math.round(last.right)} px, right of ${Math.round(right)} px: ` +
             table.innerText.slice(0, 60));
}
for (const code of document.querySelectorAll('pre > code')) {
  if (code.scrollWidth > code.clientWidth + 1)
    out.push(`code block scrolls: ${code.scrollWidth} px in ${code.clientWidth} px: ${code.innerText.slice(0, 60)}`);
}
return out;
"""

# How many characters of the code font fit in a code block's box: a probe line of that font in the first block.
FITS_JS = """
const code = document.querySelector('pre > code'), probe = document.createElement('span');
probe.textContent = 'x'.repeat(1000);
probe.style.whiteSpace = 'pre';
code.appendChild(probe);
const style = getComputedStyle(code);
const room = code.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
const width = probe.getBoundingClientRect().width / 1000;
probe.remove();
return Math.floor(room / width);
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The site built from this checkout, served on 127.0.0.1: its base URL."""
    folder = tmp_path_factory.mktemp("docs-site") / "site"
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(folder)],
                           cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert build.returncode == 0, f"mkdocs build failed:\n{build.stdout}{build.stderr}"

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # the test's output stays its own
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def pages(site: str) -> list[str]:
    """Every page of the site's navigation, relative to its root (as mkdocs lays them out: name/index.html)."""
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def files(entry: Any) -> Iterator[str]:
        if isinstance(entry, str):
            yield entry
        elif isinstance(entry, dict):
            for value in entry.values():
                yield from files(value)
        elif isinstance(entry, list):
            for item in entry:
                yield from files(item)

    def url(md: str) -> str:
        stem = md.removesuffix(".md")
        if stem == "index" or stem.endswith("/index"):  # a section's own page is its folder
            return stem.removesuffix("index")
        return stem + "/"

    return [url(md) for md in files(nav)]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    for driver in headless_chromium(CHROMIUM_FLAGS, "gtep-docs-chromium", "bash tests/ui/with-chromium.sh installs it"):
        driver.set_window_size(*WINDOW)
        yield driver


def test_the_window_is_1400_px_wide(browser: Any, site: str) -> None:
    browser.get(site)
    assert browser.execute_script("return window.innerWidth") == WINDOW[0]


def test_no_table_or_code_block_runs_past_the_text_column(browser: Any, site: str, pages: list[str]) -> None:
    assert len(pages) > 20 and "benchmarks/" in pages and "families/fluid/" in pages, pages
    overflows = []
    for page in pages:
        browser.get(site + page)
        assert "404" not in browser.title, page
        overflows += [f"{page}: {what}" for what in browser.execute_script(OVERFLOWS_JS)]
    assert not overflows, "at 1,400 x 900:\n" + "\n".join(overflows)


def test_a_code_line_of_the_limit_fits_without_wrapping(browser: Any, site: str) -> None:
    """tests/docs/test_docs_layout.py keeps code lines to CODE_LINE_LIMIT characters: that many fit at this width."""
    browser.get(site + "layout/")
    fits = browser.execute_script(FITS_JS)
    assert fits >= CODE_LINE_LIMIT, f"a code block holds {fits} characters at {WINDOW[0]} px"


def test_screenshots_of_the_widest_pages(browser: Any, site: str, tmp_path: Path) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for name, page, text in SHOTS:
        browser.get(site + page)
        found = browser.execute_script(
            "const e = [...document.querySelectorAll('table, pre')].find(e => e.innerText.includes(arguments[0]));"
            "if (e) { e.scrollIntoView(); window.scrollBy(0, -80); } return Boolean(e);", text)
        assert found, f"{page} has no table or code block with {text!r}"
        browser.save_screenshot(str(tmp_path / name))
        shutil.copyfile(tmp_path / name, ARTIFACTS / name)
    print(f"\nscreenshots: {tmp_path} (copied to {ARTIFACTS}): {', '.join(name for name, _, _ in SHOTS)}")
