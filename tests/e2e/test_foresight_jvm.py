"""Foresight with a real peer: a HotSpot JVM through ddmd with ``[debugger] speculate = "on"``,
and a real ``jdb`` session (breakpoint, where, locals, print, step, cont) that prints the same as
the same session run directly against another JVM of the same program; ddmd answered some of
jdb's commands itself.

The JVMs start suspended (``suspend=y``), so both sessions stop at the same iterations. Object
ids are masked in the comparison: ddmd's own connection asked the thread list before jdb
attached, so the VM numbers some objects in another order (nothing else may differ).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import trio

from tests.actors.rawpeers import free_port_range, monitor, wait_until
from tests.e2e.conftest import Jdk, require_tool
from tests.e2e.jdbdriver import THREAD_PROMPT, Jdb
from tests.e2e.test_bridge_jvm import (
    BREAK_LINE,
    BREAKPOINT_HIT,
    CAP,
    PROG,
    WAIT,
    classes,  # noqa: F401 (a fixture)
    jdb_session,
    run_jvm,
    vm_id,
    wait_ready,
)

pytestmark = pytest.mark.jvm

_IDS = re.compile(r"(id=|\([\w.$]+\))\d+")


async def _session(jdb: Jdb) -> list[str]:
    """What jdb prints for each command of the session (object ids masked)."""
    await jdb.expect(r"VM Started", THREAD_PROMPT)
    views: list[str] = []

    async def run(line: str, *patterns: str) -> None:
        text = await jdb.command(line, *patterns)
        # (and the spaces that align columns of ids of other widths)
        views.append(re.sub(r" +", " ", _IDS.sub(lambda m: m.group(1) + "#", text)))

    await jdb.until_stopped(f"stop at Prog:{BREAK_LINE}", r"Deferring breakpoint|Set breakpoint")
    await jdb.until_stopped("cont", *BREAKPOINT_HIT)
    for _ in range(3):
        await run("where", r"\[2\] Prog\.main")
        await run("locals", r"doubled = \d+")
        await run("print n", r"\bn = \d+")
        # Of the thread list, the main thread's line: what a JDK thread (Common-Cleaner) does at
        # the stop varies from run to run, direct too.
        text = await jdb.command("threads", r"main")
        main = [" ".join(line.split()[1:]) for line in text.splitlines() if " main " in line]
        views.append("\n".join(main))
        await jdb.until_stopped("next", "Step completed:")
        await run("where", r"\[2\] Prog\.main")
        await run("locals", r"doubled = \d+")
        await jdb.until_stopped("cont", *BREAKPOINT_HIT)
    assert await jdb.quit() == 0, jdb.transcript
    return views


async def test_a_jdb_session_through_foresight_prints_what_it_prints_direct(
    jdk: Jdk,
    classes,  # noqa: F811
    tmp_path,
) -> None:
    (port, direct) = free_port_range(2)
    with trio.fail_after(CAP * 2):
        async with (
            run_jvm(jdk, classes, direct, suspend=True),
            jdb_session(jdk, direct, "direct") as jdb,
        ):
            expected = await _session(jdb)
        async with (
            monitor([port], tmp_path, debugger={"speculate": "on"}) as h,
            run_jvm(jdk, classes, port, suspend=True),
        ):
            await wait_ready(h, port)
            async with jdb_session(jdk, h.started.current_port, "through") as jdb:
                seen = await _session(jdb)
            figures = (await h.vm(vm_id(port)))["foresight"]  # the API shows them per VM
            assert figures["on"], figures
            assert figures["answered_cache"] + figures["answered_speculation"] > 0, figures
            assert figures["round_trip"] is not None, figures
            (line,) = await wait_until(
                lambda: h.events("debugger.foresight", vm=vm_id(port)), WAIT, what="foresight"
            )
    assert seen == expected
    assert line["answered"] > 0, line


JAVA_DIR = Path(__file__).parent / "java"


@pytest.fixture(scope="module")
def views_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Prog and the IDE-shaped JDI client ``java/StopViews.java``, compiled with -g."""
    out = tmp_path_factory.mktemp("views")
    (out / "Prog.java").write_text(PROG)
    sources = [str(out / "Prog.java"), str(JAVA_DIR / "StopViews.java")]
    subprocess.run(
        [require_tool("javac"), "-g", "-d", str(out), *sources],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


async def _views(jdk: Jdk, compiled: Path, port: int) -> str:
    argv = [jdk.java, "-cp", str(compiled), "StopViews", "127.0.0.1", str(port), "Prog"]
    result = await trio.run_process(
        [*argv, str(BREAK_LINE), "3"], capture_stdout=True, capture_stderr=True
    )
    return result.stdout.decode()


async def test_an_ide_client_through_foresight_sees_what_it_sees_direct(
    jdk: Jdk,
    views_classes: Path,
    tmp_path: Path,
) -> None:
    """Three stops (a breakpoint and a step over each) of a JDI client shaped like an IDE's:
    threads, frames, class data, locals; the same views direct and through ddmd."""
    (port, direct) = free_port_range(2)
    with trio.fail_after(CAP * 2):
        async with run_jvm(jdk, views_classes, direct, suspend=True):
            expected = await _views(jdk, views_classes, direct)
        assert expected.count("stop ") == 6, expected
        async with (
            monitor([port], tmp_path, debugger={"speculate": "on"}) as h,
            run_jvm(jdk, views_classes, port, suspend=True),
        ):
            await wait_ready(h, port)
            seen = await _views(jdk, views_classes, h.started.current_port)
            figures = (await h.vm(vm_id(port)))["foresight"]
    assert seen == expected
    assert figures["answered_speculation"] > 0, figures
