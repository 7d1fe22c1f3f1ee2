"""The acceptance test of the web page: real headless Chromium (Debian's) driven by Playwright.

A `ddmd demo` subprocess (the daemon plus three simulated VMs: an ART app, a Dalvik-era app
and an Android 12+ app without thread and heap handlers) runs on free ports; the test drives
the page like a user and checks the results through the API and `ddmd clients --json`.

Needs /usr/bin/chromium (``apt-get install chromium``; Playwright's own browser download is
never used). Without it the test skips, except in CI (``CI=true``), where it fails.
A screenshot goes to ``artifacts/web-screenshot.png``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from tests.actors.needs import skip_or_fail
from tests.actors.rawpeers import free_port_range

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
STARTUP_TIMEOUT = 30.0
WAIT_MS = 20_000  # per page condition

MAIL = "com.example.mail"  # ART flavor: threads, stacks, heap
NOTES = "com.example.notes"  # Dalvik v1.6 in the 2007 draft formats
MAPS = "com.example.maps:remote"  # Android 12+: no thread or heap handlers


def _require_browser() -> None:
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright Python package (pip install -e '.[test]')")
    if not missing:
        return
    reason = "browser test needs " + " and ".join(missing)
    skip_or_fail(reason)


# ------------------------------------------------------------------------------------ daemon


def _own_ports(avoid: list[int]) -> list[int]:
    while True:
        ports = free_port_range(6)
        if ports[-1] < avoid[0] or ports[0] > avoid[-1]:
            return ports


@contextlib.contextmanager
def demo_daemon(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """`ddmd demo` on free ports; yields (control base URL, config file)."""
    scan = free_port_range(6)
    control_port, current_port, *debugger_ports = _own_ports(scan)
    config = tmp_path / "ddmd.toml"
    config.write_text(
        f"""
[scan]
ports = "{scan[0]}-{scan[-1]}"
interval = 0.2
backoff_max = 2.0

[adb]
enabled = "off"

[debugger]
ports = "{debugger_ports[0]}-{debugger_ports[-1]}"
current_port = {current_port}
state_file = "{tmp_path / "ports.json"}"

[control]
port = {control_port}

[timeouts]
ddm_request = 1.0
"""
    )
    log = (tmp_path / "demo.log").open("wb")
    env = {**os.environ, "DDMD_CONFIG": str(config)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddmd", "demo", "--config", str(config), "--log-format", "json"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
    )
    base = f"http://127.0.0.1:{control_port}"
    try:
        _wait_for(
            lambda: _named_vms(base) >= {MAIL, NOTES, MAPS} or proc.poll() is not None,
            STARTUP_TIMEOUT,
            "the demo's three VMs to be named",
        )
        if proc.poll() is not None:
            raise AssertionError(
                f"ddmd demo exited with {proc.returncode}:\n{(tmp_path / 'demo.log').read_text()}"
            )
        yield base, config
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        log.close()


def _named_vms(base: str) -> set[str]:
    try:
        vms = httpx.get(base + "/api/v1/vms", timeout=2.0, trust_env=False).json()
    except (httpx.HTTPError, ValueError):
        return set()
    return {vm["app"] for vm in vms if vm.get("app")}


def _wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


def _vms(base: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = httpx.get(base + "/api/v1/vms", trust_env=False).json()
    return result


def _vm(base: str, app: str) -> dict[str, Any]:
    (vm,) = [v for v in _vms(base) if v["app"] == app]
    return vm


def _clients_json(base: str, config: Path) -> list[dict[str, Any]]:
    control = base.removeprefix("http://")
    out = subprocess.run(
        [sys.executable, "-m", "ddmd", "clients", "--json", "--control", control],
        capture_output=True,
        check=True,
        timeout=30,
        env={**os.environ, "DDMD_CONFIG": str(config)},
    )
    result: list[dict[str, Any]] = json.loads(out.stdout)
    return result


def _heap_png(base: str, vm_id: str) -> tuple[bytes, str, dict[str, Any]]:
    r = httpx.get(
        f"{base}/api/v1/vms/{vm_id}/heap.png?width=512&height=512", trust_env=False, timeout=10
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "image/png"
    return r.content, r.headers["etag"], json.loads(r.headers["x-heap-layout"])


# ------------------------------------------------------------------------------------ the test


def test_live_page_in_chromium(tmp_path: Path) -> None:
    _require_browser()
    from playwright.sync_api import sync_playwright

    with demo_daemon(tmp_path) as (base, config), sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        context = browser.new_context(viewport={"width": 1440, "height": 1000})
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        requests: list[tuple[float, str]] = []
        problems: list[str] = []
        page.on("request", lambda r: requests.append((time.monotonic(), r.url)))
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on(
            "console",
            lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
        )
        try:
            _story(page, base, config, requests)
        finally:
            ARTIFACTS.mkdir(exist_ok=True)
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / "web-screenshot.png"), full_page=True)
            browser.close()

    # Same origin only: every request the page made went to the daemon.
    # (blob: URLs of this origin are the heap pictures the page fetched and displays.)
    foreign = sorted(
        {url for _, url in requests if not url.startswith((base + "/", f"blob:{base}/"))}
    )
    assert not foreign, foreign
    # No script errors, no failed requests and no CSP violations (all are console errors).
    assert not problems, problems


def _story(page: Any, base: str, config: Path, requests: list[tuple[float, str]]) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(base + "/")

    # 1. The VM list appears, with the three demo VMs.
    page.wait_for_function("() => document.querySelectorAll('#vms tbody tr').length === 3")
    for app in (MAIL, NOTES, MAPS):
        page.locator("#vms tbody tr", has_text=app).wait_for()
    mail = _vm(base, MAIL)
    row = page.locator(f'#vms tbody tr[data-vm-id="{mail["id"]}"]')
    assert str(mail["pid"]) in row.inner_text()
    assert "yes" in row.locator("td").nth(5).inner_text()  # DDM
    # One label of the VM's kind, as `ddmd clients` prints it: ART (not "Dalvik v2.1.0").
    assert row.locator(".vm-label").inner_text() == "ART"
    notes_row = page.locator(f'#vms tbody tr[data-vm-id="{_vm(base, NOTES)["id"]}"]')
    assert notes_row.locator(".vm-label").inner_text() == "Dalvik"

    # 2. Watching a VM: its thread table fills and the states change over time.
    row.locator("button.link").click()
    page.wait_for_selector("#threads tbody tr")

    def states() -> dict[str, str]:
        return page.eval_on_selector_all(
            "#threads tbody tr",
            "rows => Object.fromEntries(rows.map(r => [r.dataset.threadId,"
            " r.cells[3].textContent]))",
        )

    first = states()
    assert len(first) >= 3, first
    assert "main" in page.locator("#threads").inner_text()
    _wait_for(lambda: states() != first, 15, "a thread state to change on the page")

    # ... polled about twice a second while shown.
    # (page.wait_for_timeout, not time.sleep: Playwright delivers the request events only
    # while one of its calls runs.)
    began = time.monotonic()
    page.wait_for_timeout(3000)
    polls = [t for t, url in requests if t >= began and url.endswith("/threads")]
    assert 4 <= len(polls) <= 9, len(polls)

    # 3. A click on a thread shows its stack (STKL).
    page.locator("#threads tbody tr").first.click()
    page.wait_for_selector("#stack-frames li")
    assert "." in page.locator("#stack-frames li").first.inner_text()

    # 4. "Cause GC" draws the heap; a second one draws a new picture.
    assert page.locator("#heap-img").get_attribute("data-etag") in (None, "")
    page.locator("#gc").click()
    page.wait_for_function("() => (document.querySelector('#heap-img').dataset.etag || '') !== ''")
    page.wait_for_function("() => document.querySelector('#heap-img').naturalWidth > 0")
    etag1 = page.locator("#heap-img").get_attribute("data-etag")
    png1, server_etag, layout = _heap_png(base, mail["id"])
    assert server_etag == etag1
    picture = Image.open(io.BytesIO(png1))
    # The sim's 4 MiB heap: 512 Ki units of 8 bytes, 2 units a pixel, 512 x 512.
    assert picture.size == (layout["width"], layout["height"]) == (512, 512)
    assert layout["units_per_pixel"] == 2
    colours = picture.convert("RGBA").getcolors(maxcolors=1 << 16)
    assert colours is not None
    assert len(colours) >= 4  # free plus several kinds: not a blank picture
    assert page.evaluate("() => document.querySelector('#heap-img').naturalHeight") == 512
    assert page.locator("#legend li").count() >= 8
    assert "outside the largest run" in page.locator("#heap-summary").inner_text()

    page.locator("#gc").click()
    page.wait_for_function(
        f"() => document.querySelector('#heap-img').dataset.etag !== {json.dumps(etag1)}"
    )
    png2, etag2, _ = _heap_png(base, mail["id"])
    assert etag2 != etag1
    assert png2 != png1
    assert Image.open(io.BytesIO(png2)).size == (512, 512)

    # 5. Closing the panel stops the thread polling.
    page.locator("#detail-close").click()
    page.wait_for_timeout(700)  # let a poll that was in flight finish
    closed = time.monotonic()
    page.wait_for_timeout(1500)
    assert not [t for t, url in requests if t >= closed and url.endswith("/threads")]

    # 6. A VM without thread and heap handlers says so plainly.
    maps = _vm(base, MAPS)
    page.locator(f'#vms tbody tr[data-vm-id="{maps["id"]}"] button.link').click()
    page.locator("#threads-note", has_text="does not report thread states").wait_for()
    page.locator("#heap-note", has_text="does not report heap").wait_for()
    assert page.locator("#threads-scroll").is_hidden()
    # Cause GC follows `ddmd gc`, not the heap figures: Android 12 still collects on request
    # (HPGC), it only reports no heap figures after it.
    gc = httpx.post(f"{base}/api/v1/vms/{maps['id']}/gc", trust_env=False, timeout=60)
    assert gc.status_code == 200, gc.text
    assert not page.locator("#gc").is_disabled()
    page.locator("#gc").click()
    page.locator("#heap-status", has_text="GC requested").wait_for()
    page.screenshot(path=str(ARTIFACTS / "web-screenshot-modern.png"))

    # 7. "Make current" selects a VM; `ddmd clients --json` agrees.
    notes = _vm(base, NOTES)
    assert not notes["current"]
    page.locator(f'#vms tbody tr[data-vm-id="{notes["id"]}"] button.select').click()
    page.wait_for_selector(f'#vms tbody tr[data-vm-id="{notes["id"]}"] .badge.current')
    current = [vm for vm in _clients_json(base, config) if vm["current"]]
    assert [vm["app"] for vm in current] == [NOTES]

    # 8. Without an event stream (an older daemon) the page polls the VM list instead.
    polling = page.context.new_page()
    polling.route(
        "**/api/v1/events",
        lambda route: route.fulfill(status=404, content_type="application/json", body="{}"),
    )
    polling.goto(base + "/")
    polling.wait_for_function("() => document.querySelector('#live').dataset.mode === 'polling'")
    polling.wait_for_function("() => document.querySelectorAll('#vms tbody tr').length === 3")
    polling.close()

    # Back to the ART VM for the screenshot: threads, a stack, the heap picture and legend.
    page.locator(f'#vms tbody tr[data-vm-id="{mail["id"]}"] button.link').click()
    page.wait_for_selector("#threads tbody tr")
    page.wait_for_function("() => document.querySelector('#heap-img').naturalWidth > 0")
    page.locator("#threads tbody tr", has_text="main").first.click()
    page.wait_for_selector("#stack-frames li")
    page.wait_for_timeout(600)  # let the highlight of changed states fade a little
