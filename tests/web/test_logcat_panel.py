"""The web page's Logcat panel in real headless Chromium (Debian's, driven by Playwright).

Against a small fake of the control API (`tests.web.logcatfake`: the real page files, the
logcat routes as ``ddmd/control/logcat.py`` documents them, lines added by the test): lines
appear; the level filter (E hides I lines) and the text filter are asked of the API (the
stream is reopened with them); Pause holds new lines and counts them, Resume shows them; a
Java crash block is marked (every line of it, a badge on its first), a restart is a separator;
the view follows the newest line until scrolled up; at most 20,000 rows are kept and only
those in view are in the page; a workstation JVM shows the API's sentence instead (known from
the VM list, without a failed request), and so does a VM the API has no log for yet.

Needs /usr/bin/chromium and Playwright, as `test_browser.py` (a skip outside CI, a failure in
CI). Nothing is timed: every wait is Playwright's auto-waiting `expect`, capped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.logcat import recording as rec
from tests.logcat.writer import Record, write_record
from tests.web import logcatfake as fake
from tests.web import logcatrig as rig_
from tests.web.test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, _require_browser

CAP_MS = 15_000  # one condition on the page
ROW_PX = 18  # app.js LOGCAT_ROW_PX
MAX_ROWS = 20_000  # app.js LOGCAT_MAX_ROWS

JAVA_CRASH = (
    "FATAL EXCEPTION: main\n"
    f"Process: {fake.APP}, PID: {fake.APP_PID}\n"
    "java.lang.IllegalStateException: mailbox is closed\n"
    "\tat com.example.mail.Store.open(Store.java:88)\n"
    "\tat com.example.mail.MainActivity.onCreate(MainActivity.java:42)\n"
    "\tat android.app.Activity.performCreate(Activity.java:8000)\n"
)
CRASH_LINES = JAVA_CRASH.rstrip("\n").count("\n") + 1
JAVA_CRASH_ROWS = 16  # the recording's Java crash entry: 16 lines (and a final newline)
INFO, ERROR = 4, 6  # android_LogPriority


@contextlib.contextmanager
def _browser(name: str, *, failed_loads: bool = False) -> Iterator[tuple[Any, list[str]]]:
    """A page in Chromium; yields (page, problems: page errors and console errors, but for
    failed loads with ``failed_loads``). A screenshot goes to artifacts/."""
    _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        page = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
        page.set_default_timeout(CAP_MS)
        problems: list[str] = []
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on(
            "console",
            lambda m: (
                problems.append(f"console: {m.text}")
                if m.type == "error" and not (failed_loads and "Failed to load resource" in m.text)
                else None
            ),
        )
        try:
            yield page, problems
        finally:
            ARTIFACTS.mkdir(exist_ok=True)
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / name), full_page=True)
            browser.close()


def _open_vm(page: Any, vm_id: str) -> None:
    page.locator(f'#vms tbody tr[data-vm-id="{vm_id}"] button.link').click()


def _rows(page: Any) -> Any:
    return page.locator("#logcat-rows .logcat-row")


def _row(page: Any, text: str) -> Any:
    return page.locator("#logcat-rows .logcat-row", has_text=text)


def _view(page: Any) -> dict[str, float]:
    view: dict[str, float] = page.evaluate(
        "() => { const v = document.querySelector('#logcat-view');"
        " return {top: v.scrollTop, height: v.clientHeight, total: v.scrollHeight}; }"
    )
    return view


def _asked(
    page: Any,
    *,
    level: str | None = None,
    grep: str | None = None,
    whole: bool = False,
    tags: tuple[str, ...] = (),
) -> None:
    """Wait until the panel's open stream asked ddmd for exactly these filters (app.js sets
    ``data-stream`` to the stream's query once it is open, and drops it when it closes)."""
    want = {"level": level, "grep": grep, "all": "1" if whole else None, "tag": list(tags)}
    page.wait_for_function(
        """w => {
          const asked = document.querySelector('#logcat-panel').dataset.stream;
          if (asked === undefined) return false;
          const q = new URLSearchParams(asked);
          return q.get('level') === w.level && q.get('grep') === w.grep
            && q.get('all') === w.all && JSON.stringify(q.getAll('tag')) === JSON.stringify(w.tag);
        }""",
        arg=want,
    )


def _at_bottom(page: Any) -> bool:
    v = _view(page)
    return v["top"] + v["height"] >= v["total"] - ROW_PX / 2


def test_logcat_panel_against_a_fake_api() -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=CAP_MS)
    with (
        fake.fake_api() as api,
        _browser("web-logcat-fake.png", failed_loads=True) as (page, problems),
    ):
        api.add(
            [
                fake.line("onCreate: 2 accounts", level="D"),
                fake.line("poll tick: next in 300 s", level="V", tag="Mail Sync"),
                fake.line("Start proc 600:com.other.app", tag="ActivityManager", app="other"),
            ]
        )
        page.goto(api.base + "/")
        _open_vm(page, fake.APP_VM)

        # 1. The recent lines, then live ones; only the app's unless "Whole device".
        _asked(page)
        expect(_row(page, "onCreate: 2 accounts")).to_be_visible()
        expect(_row(page, "poll tick")).to_have_class(re.compile(r"\blv-V\b"))
        expect(page.locator("#logcat-status")).to_contain_text("live")
        expect(page.locator("#logcat-where")).to_have_text(f"{fake.APP} on {fake.SERIAL}")
        api.add([fake.line("hello from info"), fake.line("boom from error", level="E")])
        expect(_row(page, "boom from error")).to_have_class(re.compile(r"\blv-E\b"))
        expect(_row(page, "hello from info")).to_have_class(re.compile(r"\blv-I\b"))
        expect(_row(page, "com.other.app")).to_have_count(0)
        page.locator("#logcat-all").check()
        _asked(page, whole=True)
        assert api.stream_with(all="1")
        expect(_row(page, "com.other.app")).to_be_visible()
        page.locator("#logcat-all").uncheck()
        _asked(page)
        expect(_row(page, "com.other.app")).to_have_count(0)

        # 2. The level filter: E and above; ddmd filters (the stream is asked with level=E).
        page.locator('#logcat-panel .level[data-level="E"]').click()
        _asked(page, level="E")
        assert api.stream_with(level="E")
        expect(_row(page, "boom from error")).to_be_visible()
        expect(_row(page, "hello from info")).to_have_count(0)
        expect(_row(page, "onCreate")).to_have_count(0)
        expect(page.locator('#logcat-panel .level[data-level="E"]')).to_have_attribute(
            "aria-pressed", "true"
        )
        api.add([fake.line("another info line"), fake.line("second error", level="E")])
        expect(_row(page, "second error")).to_be_visible()
        expect(_row(page, "another info line")).to_have_count(0)

        # ... the text filter (a regular expression, in ddmd too), and the tag filter.
        page.locator('#logcat-panel .level[data-level="V"]').click()
        _asked(page)
        expect(_row(page, "another info line")).to_be_visible()
        page.locator("#logcat-grep").fill("^(hello|second)")
        _asked(page, grep="^(hello|second)")
        expect(_row(page, "hello from info")).to_be_visible()
        expect(_row(page, "second error")).to_be_visible()
        expect(_rows(page)).to_have_count(2)
        page.locator("#logcat-grep").fill("(unclosed")
        expect(page.locator("#logcat-error")).to_contain_text("not a regular expression")
        page.locator("#logcat-grep").fill("")
        page.locator("#logcat-tag").fill("-Mail Sync")
        page.locator("#logcat-tag").press("Enter")
        _asked(page, tags=("-Mail Sync",))
        expect(_row(page, "poll tick")).to_have_count(0)
        expect(_row(page, "onCreate: 2 accounts")).to_be_visible()
        expect(page.locator("#logcat-error")).to_be_hidden()
        page.locator("#logcat-tag").fill("")
        page.locator("#logcat-tag").press("Enter")
        _asked(page)
        expect(_row(page, "poll tick")).to_be_visible()

        # 3. Pause: new lines are counted, not shown; Resume shows them.
        page.locator("#logcat-pause").click()
        expect(page.locator("#logcat-pause")).to_have_text("Resume")
        api.add([fake.line(f"while paused {n}") for n in range(3)])
        expect(page.locator("#logcat-pending")).to_have_text("paused · 3 new lines")
        expect(_row(page, "while paused")).to_have_count(0)
        page.locator("#logcat-pause").click()
        expect(_row(page, "while paused")).to_have_count(3)
        expect(page.locator("#logcat-pending")).to_be_hidden()
        expect(page.locator("#logcat-pause")).to_have_text("Pause")

        # 4. A Java crash: one entry of several lines, each marked, the first with a badge;
        # the app's restart is a separator; app.crashed on the event stream shows a badge.
        api.add(
            [
                fake.line(
                    JAVA_CRASH, level="E", tag="AndroidRuntime", crash="java", buffer="crash"
                ),
                fake.line("Sending signal. PID: 4242 SIG: 9", tag="Process"),
                fake.restart(fake.APP_PID, 4301),
                fake.line("onCreate again", level="D", pid=4301),
            ]
        )
        crash_rows = page.locator("#logcat-rows .logcat-row.crash")
        expect(crash_rows).to_have_count(CRASH_LINES)
        start = page.locator("#logcat-rows .logcat-row.crash-start")
        expect(start).to_have_count(1)
        expect(start).to_contain_text("FATAL EXCEPTION: main")
        expect(start.locator(".lc-badge")).to_have_text("Java crash")
        expect(crash_rows.last).to_contain_text("Activity.performCreate(Activity.java:8000)")
        expect(_row(page, "Sending signal")).not_to_have_class(re.compile(r"\bcrash\b"))
        expect(page.locator("#logcat-rows .logcat-row.restart")).to_have_text(
            f"{fake.APP} restarted (pid 4242 \u2192 4301)"
        )
        api.publish(
            {
                "event": "app.crashed",
                "device": fake.SERIAL,
                "app": fake.APP,
                "pid": fake.APP_PID,
                "kind": "java",
                "lines": JAVA_CRASH.splitlines()[:3],
            }
        )
        expect(page.locator("#logcat-crash")).to_contain_text(f"Java crash: {fake.APP}")
        page.screenshot(path=str(ARTIFACTS / "web-logcat-crash.png"))

        # 5. Auto-scroll: follows the newest line; stops when scrolled up, and comes back.
        api.add([fake.line(f"filler {n}") for n in range(200)])
        expect(_row(page, "filler 199")).to_be_visible()
        assert _at_bottom(page)
        page.locator("#logcat-view").evaluate("v => { v.scrollTop = 0; }")
        expect(page.locator("#logcat-follow")).to_be_visible()
        expect(_row(page, "onCreate: 2 accounts")).to_be_visible()
        api.add([fake.line("while scrolled up")])
        expect(page.locator("#logcat-status")).to_contain_text("213 lines")
        expect(_row(page, "onCreate: 2 accounts")).to_be_visible()  # the view stayed
        assert _view(page)["top"] == 0
        page.locator("#logcat-follow").click()
        expect(_row(page, "while scrolled up")).to_be_visible()
        expect(page.locator("#logcat-follow")).to_be_hidden()
        api.add([fake.line("following again")])
        expect(_row(page, "following again")).to_be_visible()
        assert _at_bottom(page)

        # 6. Bounded: 25,000 more lines; 20,000 rows kept at most, a few dozen in the page.
        api.add([fake.line(f"bulk {n}", level="D") for n in range(25_000)])
        expect(_row(page, "bulk 24999")).to_be_visible()
        expect(page.locator("#logcat-status")).to_contain_text("rows kept")
        sizer = page.locator("#logcat-sizer").evaluate("s => s.getBoundingClientRect().height")
        assert MAX_ROWS * ROW_PX - 2000 * ROW_PX <= sizer <= MAX_ROWS * ROW_PX, sizer
        assert _rows(page).count() < 60
        assert _at_bottom(page)

        # 7. A workstation JVM: the API's sentence, no controls.
        _open_vm(page, fake.JVM_VM)
        expect(page.locator("#logcat-note")).to_have_text(fake.WORKSTATION + ".")
        expect(page.locator("#logcat-body")).to_be_hidden()
        page.screenshot(path=str(ARTIFACTS / "web-logcat-workstation.png"))

        # A VM that has not said its name: the API's sentence; "Whole device" still works.
        _open_vm(page, fake.NAMELESS_VM)
        expect(page.locator("#logcat-note")).to_have_text(
            fake.NAMELESS[0].upper() + fake.NAMELESS[1:] + "."
        )
        expect(page.locator("#logcat-body")).to_be_visible()
        page.locator("#logcat-all").check()
        expect(page.locator("#logcat-note")).to_be_hidden()
        expect(_row(page, "bulk 24999")).to_be_visible()
        expect(page.locator("#logcat-where")).to_have_text(f"every app on {fake.SERIAL}")
        page.locator("#logcat-all").uncheck()

        # Back to the app: a fresh list, live again.
        _open_vm(page, fake.APP_VM)
        expect(page.locator("#logcat-body")).to_be_visible()
        expect(page.locator("#logcat-note")).to_be_hidden()
        expect(_row(page, "bulk 24999")).to_be_visible()
        expect(page.locator("#logcat-status")).to_contain_text("live")
    assert not problems, problems


# ------------------------------------------------------------------------------------------
# The real daemon: the fake device's log through the real adb server and ddmd


def _now(record: Record) -> bytes:
    """``record`` as logcat -B bytes, stamped now (ddmd skips entries older than the last it
    read, as a reopened stream would repeat them)."""
    sec, nsec = divmod(time.time_ns(), 1_000_000_000)
    return write_record(dataclasses.replace(record, sec=sec, nsec=nsec))


def _record(message: str, level: int, tag: str = "MapsApp") -> bytes:
    """One logcat -B record of the app's main thread, stamped now."""
    pid = rig_.APP_PID
    return _now(Record(0, 0, pid, pid, level, tag, message.encode(), 0, rec.MAPS_UID))


def test_logcat_panel_on_a_device_through_ddmd(tmp_path: Path) -> None:
    """The acceptance test of issue 19's page: filter, pause and the crash block, for real."""
    from playwright.sync_api import expect

    _require_browser()
    expect.set_options(timeout=CAP_MS)
    with (
        rig_.live_rig(tmp_path) as rig,
        _browser("web-logcat.png") as (page, problems),
    ):
        page.goto(rig.base + "/")
        _open_vm(page, rig.app_vm)

        # 1. The app's recent lines from the device's ring (the ANR marked), then live ones.
        _asked(page)
        expect(_row(page, "frame 1 drawn in 16 ms")).to_have_class(re.compile(r"\blv-I\b"))
        anr = page.locator("#logcat-rows .logcat-row.crash-anr")
        expect(anr.first).to_contain_text(f"ANR in {rig_.APP}")
        expect(anr.first.locator(".lc-badge")).to_have_text("ANR")
        expect(page.locator("#logcat-where")).to_have_text(f"{rig_.APP} on {rig.serial}")
        expect(page.locator("#logcat-status")).to_contain_text("live")
        expect(_row(page, "wlan0: scan results")).to_have_count(0)  # wificond's, not the app's
        rig.log(_record("live info line", INFO) + _record("live error line", ERROR))
        expect(_row(page, "live info line")).to_be_visible()
        expect(_row(page, "live error line")).to_have_class(re.compile(r"\blv-E\b"))

        # 2. Filters, applied by ddmd: level E hides the I lines; a regex; the whole device.
        page.locator('#logcat-panel .level[data-level="E"]').click()
        _asked(page, level="E")
        expect(_row(page, "live error line")).to_be_visible()
        expect(_row(page, "live info line")).to_have_count(0)
        expect(_row(page, "frame 1 drawn")).to_have_count(0)
        rig.log(_record("late info line", INFO) + _record("late error line", ERROR))
        expect(_row(page, "late error line")).to_be_visible()
        expect(_row(page, "late info line")).to_have_count(0)
        page.locator('#logcat-panel .level[data-level="V"]').click()
        _asked(page)
        expect(_row(page, "late info line")).to_be_visible()
        page.locator("#logcat-grep").fill("^live ")
        _asked(page, grep="^live ")
        expect(_rows(page)).to_have_count(2)
        expect(_row(page, "live info line")).to_be_visible()
        expect(_row(page, "live error line")).to_be_visible()
        page.locator("#logcat-grep").fill("")
        page.locator("#logcat-grep").press("Enter")
        _asked(page)
        page.locator("#logcat-all").check()
        _asked(page, whole=True)
        expect(_row(page, "wlan0: scan results").first).to_be_visible()
        page.locator("#logcat-all").uncheck()
        _asked(page)
        expect(_row(page, "wlan0: scan results")).to_have_count(0)
        expect(_row(page, "late info line")).to_be_visible()

        # 3. Pause: the new lines are counted, not shown; Resume shows them.
        page.locator("#logcat-pause").click()
        rig.log(b"".join(_record(f"paused line {n}", INFO) for n in range(3)))
        expect(page.locator("#logcat-pending")).to_have_text("paused · 3 new lines")
        expect(_row(page, "paused line")).to_have_count(0)
        page.locator("#logcat-pause").click()
        expect(_row(page, "paused line")).to_have_count(3)
        expect(page.locator("#logcat-pending")).to_be_hidden()

        # 4. The recording's Java crash, logged now: one 16-line entry in the crash buffer,
        # every line marked, a badge on the first; app.crashed shows in the panel's head.
        rig.log(_now(rec.RECORDS[rig_.BACKLOG_RECORDS]))  # FATAL EXCEPTION: main ...
        crash = page.locator("#logcat-rows .logcat-row.crash-java")
        expect(crash).to_have_count(JAVA_CRASH_ROWS)
        expect(crash.first).to_contain_text("FATAL EXCEPTION: main")
        expect(crash.first).to_have_class(re.compile(r"\bcrash-start\b"))
        expect(crash.first.locator(".lc-badge")).to_have_text("Java crash")
        expect(crash.last).to_contain_text("ZygoteInit.main(ZygoteInit.java:947)")
        expect(page.locator("#logcat-crash")).to_contain_text(f"Java crash: {rig_.APP}")
        page.screenshot(path=str(ARTIFACTS / "web-logcat-device.png"))

        # 5. A workstation JVM: the API's sentence.
        said = rig.get(f"/api/v1/vms/{rig.workstation_vm}/logcat")
        assert said.status_code == 501, said.text
        _open_vm(page, rig.workstation_vm)
        expect(page.locator("#logcat-note")).to_have_text(said.json()["error"] + ".")
        expect(page.locator("#logcat-body")).to_be_hidden()
    assert not problems, problems


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-v"])
