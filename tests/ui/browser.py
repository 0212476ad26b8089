"""Headless Chromium for the ui group, driven by Selenium (Debian's chromium and chromium-driver; .ci/run and
tests/ui/with-chromium.sh install them, the tests install nothing): one profile folder per process, removed after."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Iterator, Sequence

import pytest

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def headless_chromium(flags: Sequence[str], profile: str, install_hint: str) -> Iterator[Any]:
    """A Chrome driver with `flags`, its profile in $TMPDIR/<profile>-<pid>; a clear failure naming `install_hint`
    when Chromium or its driver is missing. For a module fixture: `yield from headless_chromium(...)`."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.path.exists(path):
            pytest.fail(f"{path} is missing: {install_hint}")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"{profile}-{os.getpid()}"
    for flag in (*flags, f"--user-data-dir={folder}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(folder, ignore_errors=True)
