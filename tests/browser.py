"""A headless browser for the tests of pages: Playwright driving Debian's chromium.

No browser is downloaded: Playwright launches the system's ``chromium`` (``.ci/run``
installs it from Debian's packages). Where there is none, :data:`MISSING` says why, for a
``skipif``.
"""
from __future__ import annotations

import shutil
from pathlib import Path
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


# What stands out past the page's content column (sphinx-book-theme's article) with no
# scroll box of its own inside the column: the outermost such element, once. A box whose
# overflow-x is auto or scroll holds what is wider than it; overflow hidden cuts it off.
_OVERFLOWING = r"""async () => {
    if (window.MathJax && MathJax.startup) await MathJax.startup.promise;
    const column = document.querySelector('article.bd-article') || document.body;
    const right = column.getBoundingClientRect().right - parseFloat(getComputedStyle(column).paddingRight) + 1;
    const scrolls = el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX)
                          && el.getBoundingClientRect().right <= right;
    const found = [];
    for (const el of column.querySelectorAll('*')) {
        const box = el.getBoundingClientRect();
        if (box.width === 0 || box.right <= right) continue;
        let parent = el.parentElement;
        while (parent && parent !== column && !found.includes(parent) && !scrolls(parent)) parent = parent.parentElement;
        if (parent === column) found.push(el);
    }
    return found.map(el => `<${el.tagName.toLowerCase()} class="${el.getAttribute('class') || ''}"> `
        + `${Math.round(el.getBoundingClientRect().right - right)} px past the column: `
        + JSON.stringify(el.textContent.trim().slice(0, 60)));
}"""


def overflowing(tab: Page) -> list[str]:
    """The elements of the page open in ``tab`` that extend past its content column outside
    any scroll box (after MathJax has typeset), each described in a line."""
    return tab.evaluate(_OVERFLOWING)


AXE = Path(__file__).with_name("vendor") / "axe" / "axe.min.js"
WCAG21AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]


def accessibility_violations(tab: Page) -> list[dict]:
    """axe-core's WCAG 2.1 A and AA violations on the page open in ``tab``: each with its
    ``id`` (the rule), ``impact`` (minor, moderate, serious, critical), ``help`` and the
    CSS selectors of its ``nodes``."""
    tab.add_script_tag(path=str(AXE))
    return tab.evaluate("""async tags => {
        if (window.MathJax && MathJax.startup) await MathJax.startup.promise;
        const result = await axe.run(document, {runOnly: {type: 'tag', values: tags}});
        return result.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                                            nodes: v.nodes.map(n => n.target.join(' '))}));
    }""", WCAG21AA)
