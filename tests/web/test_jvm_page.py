"""The web page's view of plain JVMs in real headless Chromium (Debian's, driven by Playwright):
two real HotSpot JVMs in the scan range of a real ``ddmd.daemon.run``, one that can be
attached and one started with -XX:+DisableAttachMechanism.

The first shows its threads (its thread dump's Java threads, numbered and flagged as jstack
shows them, and what the list leaves out), a thread's stack from its thread dump
(the frames, their locks, its Java state), the heap figures of GC.heap_info, and Cause GC
runs GC.run (the program sees its weak reference cleared) and shows the figures after it; the
heap dump and kill buttons are offered. The second shows its threads too, and where the attach
API would answer, the sentence that says why it cannot: no wall of refusals, no SIGQUIT.

Needs /usr/bin/chromium and Playwright (a skip outside CI, a failure in CI), a JDK 17.
"""

from __future__ import annotations

import contextlib
import queue
import re
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.actors.rawpeers import free_port_range, monitor
from tests.hotspot.conftest import Jvm, quiet_classes, run_quiet, tool  # noqa: F401 (a fixture)
from tests.web.test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, _require_browser

pytestmark = pytest.mark.jvm

CAP_MS = 20_000  # one condition on the page
NO_SEGMENTS = "com.example.nosegments"
START_CAP = 60.0


@dataclass
class Rig:
    base: str
    open_jvm: Jvm
    closed_jvm: Jvm
    no_segments: str  # the id of an app's VM that collects but sends no heap segments

    def get(self, path: str) -> Any:
        response = httpx.get(self.base + path, trust_env=False, timeout=30)
        assert response.status_code == 200, response.text
        return response.json()


async def _serve(classes: Path, tmp_path: Path, out: queue.Queue[Any], stop: trio.Event) -> None:
    first, second, third = free_port_range(3)
    async with (
        run_quiet(classes, first) as open_jvm,
        run_quiet(classes, second, flags=["-XX:+DisableAttachMechanism"]) as closed_jvm,
        monitor([first, second, third], tmp_path) as h,
    ):
        # An app whose VM collects (HPGC) but sends no heap segments (HPSG refused).
        await h.start_sim(
            third, pid=4711, app_name=NO_SEGMENTS, package_name=NO_SEGMENTS, fail_types=("HPSG",)
        )
        await h.wait_vm(f"tcp:{third}", lambda v: v["app"] == NO_SEGMENTS, timeout=START_CAP)
        for jvm in (open_jvm, closed_jvm):
            await h.wait_vm(
                jvm.vm_id, lambda v: v["ddm"] is False and v["pid"] is not None, timeout=START_CAP
            )
        host, port = h.started.control
        out.put(Rig(f"http://{host}:{port}", open_jvm, closed_jvm, f"tcp:{third}"))
        await stop.wait()


@contextlib.contextmanager
def rig(classes: Path, tmp_path: Path) -> Iterator[Rig]:
    """The JVMs and the daemon in a trio thread of their own (Playwright's sync API runs in
    this one); stopped at the end."""
    out: queue.Queue[Any] = queue.Queue()
    token: list[trio.lowlevel.TrioToken] = []
    stop: list[trio.Event] = []

    async def main() -> None:
        token.append(trio.lowlevel.current_trio_token())
        stop.append(trio.Event())
        await _serve(classes, tmp_path, out, stop[0])

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # handed to the test's thread
            out.put(exc)
        else:
            out.put(None)

    thread = threading.Thread(target=run, name="jvm-page-rig", daemon=True)
    thread.start()
    first = out.get(timeout=START_CAP * 2)
    if isinstance(first, BaseException):
        raise first
    assert first is not None, "the rig stopped before it was ready"
    try:
        yield first
    finally:
        trio.from_thread.run_sync(stop[0].set, trio_token=token[0])
        thread.join(timeout=60)
        last = out.get(timeout=1) if not out.empty() else None
        if isinstance(last, BaseException):
            raise last


@contextlib.contextmanager
def browser_page(name: str) -> Iterator[tuple[Any, list[str]]]:
    _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        page = browser.new_context(viewport={"width": 1440, "height": 1100}).new_page()
        page.set_default_timeout(CAP_MS)
        problems: list[str] = []
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        try:
            yield page, problems
        finally:
            ARTIFACTS.mkdir(exist_ok=True)
            with contextlib.suppress(Exception):
                page.screenshot(path=str(ARTIFACTS / name), full_page=True)
            browser.close()


def java_version() -> str:
    """``java -version``'s version: 17.0.15."""
    done = subprocess.run(
        [tool("java"), "-version"], capture_output=True, text=True, timeout=60, check=True
    )
    match = re.search(r'version "([\d.]+)', done.stderr)
    assert match, done.stderr
    return match[1]


def jstack_threads(pid: int) -> list[tuple[str, int | None, bool]]:
    """``jstack PID``'s threads: name, #N (None for the JVM's own threads), daemon."""
    done = subprocess.run(
        [tool("jstack"), str(pid)], capture_output=True, text=True, timeout=60, check=True
    )
    text = done.stdout.split("\nJNI global refs")[0]
    return [
        (m["name"], None if m["n"] is None else int(m["n"]), bool(m["daemon"]))
        for m in _JSTACK.finditer(text)
    ]


_JSTACK = re.compile(
    r'^"(?P<name>.*)" (?:#(?P<n>\d+) )?(?P<daemon>daemon )?(?:prio=\d+ )?os_prio=', re.M
)


def open_vm(page: Any, vm_id: str) -> None:
    page.locator(f'#vms tbody tr[data-vm-id="{vm_id}"] button.link').click()
    page.wait_for_function(
        "id => document.querySelector('#detail-sub').textContent.startsWith(id)", arg=vm_id
    )


def test_the_plain_jvm_view_shows_threads_a_stack_and_the_heap(quiet_classes, tmp_path):  # noqa: F811
    with rig(quiet_classes, tmp_path) as live, browser_page("web-plain-jvm.png") as (page, bad):
        page.goto(live.base + "/")
        jvm = live.open_jvm
        # Its kind as `ddmd clients` says it: "OpenJDK 17.0.15", the version java reports.
        label = page.locator(f'#vms tbody tr[data-vm-id="{jvm.vm_id}"] .vm-label')
        assert label.inner_text() == f"OpenJDK {java_version()}"
        open_vm(page, jvm.vm_id)
        assert f" · OpenJDK {java_version()}" in page.locator("#detail-sub").inner_text()

        # Threads: the Java threads of its thread dump, numbered as jstack numbers them, with
        # their daemon flags; the note names the JVM's own threads the table leaves out.
        page.locator("#threads tbody tr", has_text="worker one").wait_for()
        seen = jstack_threads(jvm.process.pid)
        java = {n: (name, daemon) for name, n, daemon in seen if n is not None}
        own = [name for name, n, _ in seen if n is None]
        ids = page.locator("#threads tbody tr td:nth-child(1)").all_inner_texts()
        assert sorted(int(i) for i in ids) == sorted(java)
        for n, (name, daemon) in java.items():
            row = page.locator(f'#threads tbody tr[data-thread-id="{n}"] td')
            assert row.nth(2).inner_text() == name
            assert row.nth(6).inner_text() == ("yes" if daemon else "")
        left = page.locator("#threads-note").inner_text()
        assert left.startswith(f"Left out: {len(own)} threads, the JVM's own threads"), left
        assert all(name in left for name in own), left

        # A stack from the JVM's thread dump: frames, their locks, the Java state.
        page.locator("#threads tbody tr", has_text="main").first.click()
        page.locator("#stack-frames li", has_text="Quiet").first.wait_for()
        frames = page.locator("#stack-frames li").all_inner_texts()
        assert frames[0].startswith("java.lang.Object.wait (native method)")
        assert any(re.match(r"Quiet\.main \(Quiet\.java:\d+\)", f) for f in frames), frames
        assert any("- locked <0x" in f for f in frames), frames
        assert page.locator("#stack-title").text_content().endswith("· main · WAITING")
        assert page.locator("#stack-note").is_hidden()

        # Heap figures from GC.heap_info, in the heap table.
        java_row = page.locator('#heaps tbody tr[data-space="Java heap (G1)"]')
        java_row.wait_for()
        assert java_row.locator("td").nth(2).inner_text() == "256.0 MiB"  # Max: -Xmx256m
        assert page.locator('#heaps tbody tr[data-space="Metaspace"]').count() == 1
        assert "GC.heap_info" in page.locator("#heap-note").inner_text()

        # Cause GC: GC.run in the JVM (its weak reference is cleared), the figures after it.
        page.locator("#gc").click()
        page.locator("#heap-status", has_text="(GC.run)").wait_for()
        page.wait_for_function("() => !document.querySelector('#gc').disabled")
        assert jvm.printed("collected")

        # A heap dump (the attach API) with its histogram; kill is offered (JDWP).
        page.wait_for_function("() => !document.querySelector('#hprof-dump').disabled")
        assert not page.locator("#kill").is_disabled()
        page.locator("#hprof-dump").click()
        apples = page.locator("#hprof-classes tbody tr", has_text="Quiet$Apple")
        apples.first.wait_for()
        assert apples.first.locator("td").nth(1).inner_text() == "3,000"
        assert bad == []


def test_a_jvm_that_cannot_be_attached_says_why_where_the_figures_would_be(
    quiet_classes,  # noqa: F811
    tmp_path,
):
    with rig(quiet_classes, tmp_path) as live, browser_page("web-closed-jvm.png") as (page, bad):
        jvm = live.closed_jvm
        page.goto(f"{live.base}/#vm={jvm.vm_id}")  # the link the README shows: this VM, open
        page.wait_for_function(
            "id => document.querySelector('#detail-sub').textContent.startsWith(id)",
            arg=jvm.vm_id,
        )
        sentence = (
            f"Quiet (pid {jvm.process.pid}) was started with -XX:+DisableAttachMechanism (its "
            "command line): it accepts no attach, from ddmd, jstack or jcmd."
        )
        page.locator("#threads tbody tr", has_text="main").wait_for()  # over JDWP: still there
        daemon = page.locator("#threads tbody tr td:nth-child(7)").all_inner_texts()
        assert set(daemon) == {"\u2014"}  # JDWP does not say: not a blank that reads as "no"
        page.locator("#threads-note", has_text="whether a thread is a daemon is unknown").wait_for()
        page.locator("#heap-note", has_text=sentence).wait_for()
        assert page.locator("#gc").is_disabled()
        page.locator("#threads tbody tr", has_text="main").first.click()
        page.locator("#stack-note", has_text=sentence).wait_for()
        page.locator("#hprof-reason", has_text=sentence).wait_for()
        assert page.locator("#hprof-dump").is_disabled()
        assert not jvm.printed("Full thread dump")
        assert bad == []


def test_cause_gc_is_offered_wherever_ddmd_gc_works(quiet_classes, tmp_path):  # noqa: F811
    with (
        rig(quiet_classes, tmp_path) as live,
        browser_page("web-gc-no-segments.png") as (page, bad),
    ):
        page.goto(live.base + "/")
        open_vm(page, live.no_segments)
        page.locator("#gc").click()  # no segments come: a plain GC instead
        page.locator("#heap-status", has_text="GC requested").wait_for()
        page.locator("#heap-note", has_text="heap segments").wait_for()  # what it cannot do
        page.wait_for_function("() => !document.querySelector('#gc').disabled")
        done = httpx.post(
            f"{live.base}/api/v1/vms/{live.no_segments}/gc", trust_env=False, timeout=30
        )
        assert done.status_code == 200, done.text  # `ddmd gc` works: so does the button
        page.locator("#gc").click()
        page.locator("#heap-status", has_text="GC requested").wait_for()
        assert not page.locator("#gc").is_disabled()
        assert bad == []
