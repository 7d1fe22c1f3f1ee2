"""The web page's extension cards, in real headless Chromium: ``ddmd sysmon`` runs next to
``ddmd demo``; its VM panel shows the system monitor's figures and two small charts (load and
memory, last 5 minutes), which grow as reports arrive through the event stream."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.web.test_browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    WAIT_MS,
    _require_browser,
    _wait_for,
    demo_daemon,
)


def _scan_ports(config: Path) -> tuple[int, int]:
    for line in config.read_text().splitlines():
        if line.startswith("ports =") and "-" in line:
            first, last = line.split("=", 1)[1].strip().strip('"').split("-")
            return int(first), int(last)
    raise AssertionError("no [scan] ports in the demo config")


def _sysmon_vm(base: str) -> dict[str, Any] | None:
    vms = httpx.get(base + "/api/v1/vms", trust_env=False).json()
    found = [v for v in vms if v.get("kind") == "system monitor"]
    return found[0] if found else None


def test_the_system_monitor_card_and_its_charts_update(tmp_path: Path) -> None:
    _require_browser()
    from playwright.sync_api import sync_playwright

    with demo_daemon(tmp_path) as (base, config):
        _, last = _scan_ports(config)
        monitor = subprocess.Popen(
            [sys.executable, "-m", "ddmd", "sysmon", "--port", str(last), "--interval", "0.3"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        try:
            vm = _wait_for(lambda: _sysmon_vm(base), 20, "the system monitor to be listed")
            with sync_playwright() as pw:
                browser = pw.chromium.launch(
                    executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
                )
                problems: list[str] = []
                try:
                    page = browser.new_page()
                    page.set_default_timeout(WAIT_MS)
                    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
                    page.goto(f"{base}/#vm={vm['id']}")
                    card = page.locator('.ext-card[data-handler="sysmon"]')
                    card.wait_for()
                    text = card.inner_text()
                    assert "load 1/5/15 min" in text
                    assert "memory used" in text

                    read = (
                        "() => { const load = document.querySelector("
                        "'svg[data-chart=\"chart-load\"]');"
                        " const memory = document.querySelector("
                        "'svg[data-chart=\"chart-memory\"] polyline');"
                        " return [Number(load ? load.dataset.points : 0),"
                        " memory ? memory.getAttribute('points') : null]; }"
                    )
                    page.wait_for_function(f"() => ({read})()[0] >= 2")
                    before, line = page.evaluate(read)
                    # New reports come by the event stream; the charts grow without a reload.
                    page.wait_for_function(
                        "n => Number(document.querySelector("
                        "'svg[data-chart=\"chart-load\"]').dataset.points) > n",
                        arg=before,
                    )
                    after, moved = page.evaluate(read)
                    assert after > before
                    assert moved != line
                    assert not problems, problems
                finally:
                    browser.close()
        finally:
            monitor.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                monitor.wait(timeout=10)
            if monitor.poll() is None:
                monitor.kill()
