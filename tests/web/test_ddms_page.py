"""The web page's Profiling panel in real headless Chromium, against `ddmd demo`: on the ART
app every button works (method trace with its download and top methods, heap dump with its
download and class histogram, the allocation tracker, kill after the confirmation); on the
Android 12+ app the allocation tracker and heap dump are disabled with the daemon's sentence.

Needs /usr/bin/chromium and Playwright, as `test_browser.py` (a skip outside CI, a failure in
CI). What the page shows is compared with what the API itself answers.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import httpx

from ddmd.sim.hprof import sim_heap_content
from ddmd.sim.trace import DEFAULT_CALL_COUNTS
from tests.web.test_browser import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    MAIL,
    MAPS,
    WAIT_MS,
    _require_browser,
    _vm,
    _vms,
    _wait_for,
    demo_daemon,
)

#: The slowest button: a heap dump of the sim's small heap, then its histogram.
BUTTON_MS = 30_000


def _sentence(text: str) -> str:
    """What the page makes of the daemon's words (app.js `sentence`)."""
    s = text.strip()
    first = s.split(maxsplit=1)[0] if s else ""
    head = s[:1].upper() + s[1:] if first.isascii() and first.isalpha() and first.islower() else s
    return head + ("" if s.endswith((".", "!", "?")) else ".")


def _profiling(base: str, vm_id: str) -> dict[str, Any]:
    response = httpx.get(f"{base}/api/v1/vms/{vm_id}/profiling", trust_env=False, timeout=10)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _open(page: Any, vm_id: str) -> None:
    page.locator(f'#vms tbody tr[data-vm-id="{vm_id}"] button.link').click()
    page.wait_for_function(
        "id => document.querySelector('#detail-sub').textContent.startsWith(id)", arg=vm_id
    )


def _enabled(page: Any, selector: str) -> None:
    page.wait_for_function(
        "s => !document.querySelector(s).disabled", arg=selector, timeout=BUTTON_MS
    )


def _download(page: Any, link: str, base: str) -> tuple[str, bytes]:
    """Click a capture link; the file the browser saves (name, bytes)."""
    with page.expect_download(timeout=BUTTON_MS) as saved:
        page.locator(link).click()
    download = saved.value
    assert download.url.startswith(f"blob:{base}/"), download.url
    return download.suggested_filename, Path(download.path()).read_bytes()


def _capture(base: str, name: str) -> bytes:
    response = httpx.get(f"{base}/api/v1/captures/{name}", trust_env=False, timeout=30)
    assert response.status_code == 200, response.text
    return response.content


def test_the_profiling_buttons_in_chromium(tmp_path: Path) -> None:
    _require_browser()
    from playwright.sync_api import sync_playwright

    with demo_daemon(tmp_path) as (base, _config), sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        context = browser.new_context(viewport={"width": 1440, "height": 1100})
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        requests: list[str] = []
        page_errors: list[str] = []
        console_errors: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.on("pageerror", lambda e: page_errors.append(str(e)))
        page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
        try:
            page.goto(base + "/")
            page.wait_for_function("() => document.querySelectorAll('#vms tbody tr').length === 3")
            _android_12_says_why(page, base)
            _every_button_on_the_art_app(page, base)
            # Up to here nothing failed: no failed request, no CSP violation.
            assert not console_errors, console_errors
            _kill_after_the_confirmation(page, base, requests)
        finally:
            ARTIFACTS.mkdir(exist_ok=True)
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "web-profiling.png"), full_page=True)
            browser.close()
    assert not page_errors, page_errors
    foreign = sorted({url for url in requests if not url.startswith((base + "/", f"blob:{base}/"))})
    assert not foreign, foreign


def _android_12_says_why(page: Any, base: str) -> None:
    maps = _vm(base, MAPS)
    _open(page, maps["id"])
    features = _profiling(base, maps["id"])["features"]
    assert not features["allocs"]["available"]
    assert not features["hprof"]["available"]
    page.wait_for_function("() => !document.querySelector('#allocs-reason').hidden")
    page.wait_for_function("() => !document.querySelector('#hprof-reason').hidden")
    assert page.locator("#allocs-reason").inner_text() == _sentence(features["allocs"]["reason"])
    assert page.locator("#hprof-reason").inner_text() == _sentence(features["hprof"]["reason"])
    for button in ("#allocs-start", "#allocs-stop", "#allocs-refresh", "#hprof-dump"):
        assert page.locator(button).is_disabled(), button
    # Method tracing is still there on Android 12+, and so is kill.
    assert features["trace"]["available"]
    assert page.locator("#trace-start").is_enabled()
    assert page.locator("#trace-reason").is_hidden()
    assert page.locator("#kill").is_enabled()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web-profiling-modern.png"), full_page=True)


def _every_button_on_the_art_app(page: Any, base: str) -> None:
    mail = _vm(base, MAIL)
    _open(page, mail["id"])

    # Method trace: start, stop, the top methods, the file.
    _enabled(page, "#trace-start")
    if _profiling(base, mail["id"])["trace"] == "off":  # (when it is "unknown", both work)
        assert page.locator("#trace-stop").is_disabled()
    page.locator("#trace-start").click()
    page.locator("#trace-state", has_text="tracing").wait_for()
    _enabled(page, "#trace-stop")
    assert _profiling(base, mail["id"])["trace"] != "off"
    page.locator("#trace-stop").click()
    page.wait_for_selector("#trace-methods tbody tr", timeout=BUTTON_MS)
    methods = page.locator("#trace-methods tbody tr td:first-child").all_inner_texts()
    recorded = {name.split("(", 1)[0] for name in DEFAULT_CALL_COUNTS}
    assert set(methods) == recorded
    assert _profiling(base, mail["id"])["trace"] == "off"
    _enabled(page, "#trace-start")
    name, data = _download(page, "#trace-link", base)
    assert name.startswith("com.example.mail-")
    assert name.endswith(".trace")
    assert data.startswith((b"*version", b"SLOW"))
    assert data == _capture(base, name)
    assert page.locator("#trace-link").get_attribute("data-bytes") == str(len(data))

    # Heap dump: the histogram and the file.
    _enabled(page, "#hprof-dump")
    page.locator("#hprof-dump").click()
    page.wait_for_selector("#hprof-classes tbody tr", timeout=BUTTON_MS)
    expected = sim_heap_content(MAIL).expected_instances()
    rows = page.eval_on_selector_all(
        "#hprof-classes tbody tr",
        "rows => rows.map(r => [r.cells[0].textContent, r.cells[1].textContent])",
    )
    shown = {cls: int(count.replace(",", "")) for cls, count in rows}
    assert shown[f"{MAIL}.Message"] == expected[f"{MAIL}.Message"]
    assert all(expected.get(cls) == n for cls, n in shown.items()), shown
    headers = page.locator("#hprof-classes thead th").all_inner_texts()
    assert headers[:3] == ["Class", "Instances", "Shallow bytes"]
    assert {"app", "image", "zygote"} <= set(headers)
    name, data = _download(page, "#hprof-link", base)
    assert name.endswith(".hprof")
    assert data.startswith(b"JAVA PROFILE 1.0.3\0")
    assert data == _capture(base, name)

    # Allocation tracker: start, the table, refresh, stop.
    _enabled(page, "#allocs-start")
    page.locator("#allocs-start").click()
    page.wait_for_selector("#allocs-list tbody tr", timeout=BUTTON_MS)
    listed = httpx.get(f"{base}/api/v1/vms/{mail['id']}/allocs", trust_env=False, timeout=10).json()
    assert listed["enabled"] is True
    assert listed["allocations"]
    classes = page.locator("#allocs-list tbody tr td:nth-child(2)").all_inner_texts()
    assert classes
    assert all("/" not in c and not c.startswith("L") for c in classes), classes
    assert f"{MAIL}.Message" in set(classes) | set(
        page.locator("#allocs-classes tbody tr td:first-child").all_inner_texts()
    )
    assert page.locator("#allocs-classes tbody tr").count() >= 1
    assert page.locator("#allocs-start").is_disabled()
    reads = page.locator("#allocs-summary").get_attribute("data-reads")
    page.locator("#allocs-refresh").click()
    page.wait_for_function(
        "n => document.querySelector('#allocs-summary').dataset.reads !== n", arg=reads
    )
    assert page.locator("#allocs-list tbody tr").count() >= 1
    _enabled(page, "#allocs-stop")
    page.locator("#allocs-stop").click()
    page.locator("#allocs-summary", has_text="Tracking is off").wait_for(timeout=BUTTON_MS)
    _enabled(page, "#allocs-start")
    assert page.locator("#allocs-stop").is_disabled()
    page.screenshot(path=str(ARTIFACTS / "web-profiling.png"), full_page=True)


def _kill_after_the_confirmation(page: Any, base: str, requests: list[str]) -> None:
    mail = _vm(base, MAIL)
    dialogs: list[str] = []

    def dismiss(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    # Cancelled: nothing is sent.
    page.once("dialog", dismiss)
    page.locator("#kill").click()
    assert dialogs
    assert dialogs[0].startswith(f"Kill {MAIL} (pid {mail['pid']})?")
    assert not [url for url in requests if url.endswith("/kill")]
    assert any(v["id"] == mail["id"] for v in _vms(base))

    def accept(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    page.once("dialog", accept)
    page.locator("#kill").click()
    assert len(dialogs) == 2
    page.locator("#kill-state", has_text="killed").wait_for(timeout=BUTTON_MS)
    # The VM leaves the daemon's list and the page's.
    _wait_for(
        lambda: not any(v["id"] == mail["id"] for v in _vms(base)), 30, "the VM to be dropped"
    )
    page.wait_for_function(
        'id => !document.querySelector(`#vms tbody tr[data-vm-id="${id}"]`)', arg=mail["id"]
    )
    assert page.locator("#vms tbody tr").count() == 2
    page.locator("#prof-note", has_text="This VM is gone.").wait_for()
    assert page.locator("#trace-start").is_disabled()
