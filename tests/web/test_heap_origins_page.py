"""The web page says which GC its heap table and its segment summary come from, in the words
`ddmd heap` prints (control/origins.py), with "N s ago": real headless Chromium against
`ddmd demo`, as tests/web/test_browser.py (a skip outside CI, a failure in CI).

The demo's ART app runs a GC of its own every few seconds and reports its heap figures after
each; the page's Cause GC takes a segment dump (a GC ddmd runs). Right after it both parts
name ddmd's GC; after the app's next GC of its own the heap table names that one, and the
segment summary says the figures above come from a later GC.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.web.test_browser import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    MAIL,
    WAIT_MS,
    _require_browser,
    _vm,
    demo_daemon,
)

#: A GC, the segment dump, and the app's next GC of its own (every 3 s in the demo).
GC_MS = 30_000
CLOCK = r"\d\d:\d\d:\d\d"
OURS = "after the GC ddmd ran"
OUR_DUMP = "after the GC ddmd ran for a segment dump"
VM_OWN = "after a GC of the VM's own (or the app's System.gc())"
LATER = "note: the heap figures above come from a later GC than these segments"


def _text(page: Any, selector: str) -> str:
    text: str = page.locator(selector).inner_text()
    return text


def _wait_text(page: Any, selector: str, pattern: str) -> str:
    page.wait_for_function(
        "([s, p]) => { const n = document.querySelector(s);"
        " return n && !n.hidden && new RegExp(p).test(n.textContent); }",
        arg=[selector, pattern],
        timeout=GC_MS,
    )
    return _text(page, selector)


def _cli_heap(base: str, config: Path, vm_id: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "ddmd", "heap", vm_id, "--control", base.removeprefix("http://")],
        capture_output=True,
        check=True,
        timeout=30,
        env={**os.environ, "DDMD_CONFIG": str(config)},
    )
    return out.stdout.decode()


def test_the_heap_panel_says_which_gc_each_part_comes_from(tmp_path: Path) -> None:
    _require_browser()
    from playwright.sync_api import sync_playwright

    with demo_daemon(tmp_path) as (base, config), sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        page = browser.new_context(viewport={"width": 1440, "height": 1100}).new_page()
        page.set_default_timeout(WAIT_MS)
        problems: list[str] = []
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        try:
            page.goto(base + "/")
            mail = _vm(base, MAIL)
            page.locator(f'#vms tbody tr[data-vm-id="{mail["id"]}"] button.link').click()
            # The heap table: the figures of the app's own GCs (HPIF at every GC).
            said = _wait_text(page, "#heaps-origin", rf"^taken at {CLOCK} \(\d+ s ago\), ")
            assert re.fullmatch(rf"taken at {CLOCK} \(\d+ s ago\), .+", said), said

            # Cause GC: a segment dump after a GC ddmd runs; both parts name it.
            page.locator("#gc").click()
            dump = _wait_text(page, "#images-origin", re.escape(OUR_DUMP))
            assert re.fullmatch(rf"taken at {CLOCK} \(\d+ s ago\), {OUR_DUMP}", dump), dump
            # `ddmd heap` says the same words at the same local time (without "s ago").
            cli = _cli_heap(base, config, mail["id"])
            page_line = re.sub(r" \(\d+ s ago\)", "", dump)
            assert f"  {page_line}\n" in cli, (page_line, cli)

            # The app's next GC of its own: the table names it, the summary tells them apart.
            heaps = _wait_text(page, "#heaps-origin", re.escape(VM_OWN))
            assert heaps.endswith(VM_OWN), heaps
            note = _wait_text(page, "#images-origin", re.escape(LATER))
            assert note.startswith(page_line.split(",")[0] + " ("), (note, page_line)
            assert note.endswith(f"{OUR_DUMP} · {LATER}"), note
            cli = _cli_heap(base, config, mail["id"])
            assert f"  {page_line}\n  {LATER}\n" in cli, cli
            assert re.search(rf"^  taken at {CLOCK}, {re.escape(VM_OWN)}$", cli, re.M), cli
        finally:
            ARTIFACTS.mkdir(exist_ok=True)
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "web-heap-origins.png"), full_page=True)
            browser.close()
    assert not problems, problems
