"""Issue 20, part 2, item 1, on the web page and through the real daemon (`ddmd demo`, real
headless Chromium as in test_browser.py): with three VMs and none selected, the page says
"port N: no current VM — ddmd select TARGET" with the port the daemon bound, and beside each VM
"attach your debugger to localhost:PORT" with that VM's own port; once a VM is made current
the line goes. `ddmd clients` and `ddmd attach` say the same through the same daemon."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.web.test_browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    MAIL,
    WAIT_MS,
    _require_browser,
    _vms,
    demo_daemon,
)


def _configured_current_port(config: Path) -> int:
    for line in config.read_text().splitlines():
        if line.startswith("current_port ="):
            return int(line.split("=", 1)[1])
    raise AssertionError("no [debugger] current_port in the demo config")


def _ddmd(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ddmd", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DDMD_CONFIG": str(config)},
        check=False,
    )


def test_the_page_says_port_8700_has_no_current_vm_and_where_to_attach(tmp_path: Path) -> None:
    _require_browser()
    from playwright.sync_api import sync_playwright

    with demo_daemon(tmp_path) as (base, config):
        port = _configured_current_port(config)
        health = httpx.get(base + "/api/v1/health", trust_env=False).json()
        assert health["current_port"] == port  # as bound by the daemon
        line = f"port {port}: no current VM \u2014 'ddmd select TARGET'"

        # The CLI, through the same daemon.
        clients = _ddmd(config, "clients")
        assert clients.returncode == 0, clients.stderr
        assert clients.stdout.splitlines()[-1] == line
        vms = _vms(base)
        mail: dict[str, Any] = next(vm for vm in vms if vm["app"] == MAIL)
        attach = _ddmd(config, "attach", "mail")
        assert attach.returncode == 0, attach.stderr
        assert f"  jdb -attach localhost:{mail['debugger_port']}" in attach.stdout.splitlines()

        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
            )
            problems: list[str] = []
            try:
                page = browser.new_page()
                page.set_default_timeout(WAIT_MS)
                page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
                page.goto(base + "/")
                page.wait_for_function(
                    "() => document.querySelectorAll('#vms tbody tr').length === 3"
                )
                notice = page.locator("#no-current")
                notice.wait_for(state="visible")
                page.wait_for_function(
                    f"() => document.querySelector('#no-current').textContent.startsWith("
                    f"'port {port}: ')"
                )
                assert notice.inner_text().startswith(
                    f"port {port}: no current VM \u2014 ddmd select TARGET"
                )
                assert notice.locator("code").inner_text() == "ddmd select TARGET"

                # Beside each VM: its own port.
                for vm in vms:
                    row = page.locator(f'#vms tbody tr[data-vm-id="{vm["id"]}"]')
                    hint = row.locator(".attach-hint")
                    assert hint.inner_text() == (
                        f"attach your debugger to localhost:{vm['debugger_port']}"
                    )

                # Made current: the line goes; the hints stay.
                page.locator(f'#vms tbody tr[data-vm-id="{mail["id"]}"] button.select').click()
                notice.wait_for(state="hidden")
                assert page.locator("#vms tbody tr .attach-hint").count() == 3
            finally:
                browser.close()
            assert not problems, problems

        after = _ddmd(config, "clients")
        assert "no current VM" not in after.stdout
        current = _ddmd(config, "attach")  # no TARGET: the current VM
        assert current.returncode == 0, current.stderr
        assert current.stdout.splitlines()[-1] == (
            f"It is the current VM too: localhost:{port} reaches it as well."
        )
