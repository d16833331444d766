"""A headless browser for the tests of pages: Playwright driving Debian's chromium.

No browser is downloaded: Playwright launches the system's ``chromium`` (``.ci/run``
installs it from Debian's packages). Where there is none, :data:`MISSING` says why, for a
``skipif``.
"""
from __future__ import annotations

import shutil
from contextlib import contextmanager
from typing import Iterator

from playwright.sync_api import Page, sync_playwright

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MISSING = None if CHROMIUM else "no chromium on this machine (Debian: apt-get install chromium)"
# A page under test that runs a script of its own leaves this mark, or opens a dialog.
MARK = "__hostile_ran__"


@contextmanager
def page() -> Iterator[Page]:
    """A fresh headless page that records every dialog a script opens (``page.dialogs``)."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            tab = browser.new_page()
            tab.dialogs = []

            def record(dialog):
                tab.dialogs.append(dialog.message)
                dialog.dismiss()

            tab.on("dialog", record)
            yield tab
        finally:
            browser.close()


def hostile_marks(tab: Page) -> list:
    """What hostile markup managed to do in ``tab``: its mark, and the dialogs it opened."""
    tab.wait_for_timeout(500)  # let onerror handlers of broken images fire
    ran = tab.evaluate(f"window.{MARK} === undefined ? [] : [window.{MARK}]")
    return ran + tab.dialogs
