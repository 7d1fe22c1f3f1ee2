"""A class redefined while no debugger is attached (issue 30, item 4), with real peers: a
HotSpot JVM, a Java agent loaded into it through the Attach API, the real ``jdb`` and a real
``ddmd.daemon.run`` (``tests.actors.rawpeers.monitor``).

Android Studio's Apply Changes redefines classes through a JVMTI agent, which JDWP never
reports; a debugger must never get a stale line table or method list because of it. Here:
session 1 through ddmd stops at a line of ``Target.work``, quits; an agent (``Agent-Class``,
``Can-Redefine-Classes: true``, ``agentmain`` calling ``Instrumentation.redefineClasses``) gives
``Target`` a new version whose body sits on other lines; session 2 through ddmd stops at a line
that exists only in the new version. It guards any cache of method data kept across sessions.

Every wait is bounded; nothing is timed.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from tests.actors.rawpeers import free_port_range, monitor
from tests.e2e.conftest import Jdk, require_tool
from tests.e2e.test_bridge_jvm import (
    WAIT,
    Jvm,
    jdb_session,
    run_jvm,
    wait_ready,
    wait_released,
)

pytestmark = pytest.mark.jvm

CAP = 90  # seconds: absolute cap on the test (two jdb sessions, an attach)

MAIN = """\
public class Redef {
    public static void main(String[] args) throws Exception {
        System.out.println("started");
        int counter = 0;
        while (true) {
            counter++;
            Target.work(counter);
            Thread.sleep(20);
        }
    }
}
"""
TARGET_V1 = """\
public class Target {
    static int work(int n) {
        int version = 1;
        System.out.println("tick " + n + " " + version); // OLD
        return version;
    }
}
"""
TARGET_V2 = """\
public class Target {
    static int work(int n) {
        // The body moved down: the lines below exist only in this version.
        //
        //
        //
        //
        int version = 2;
        System.out.println("tick " + n + " " + version); // NEW
        return version;
    }
}
"""
AGENT = """\
import java.lang.instrument.ClassDefinition;
import java.lang.instrument.Instrumentation;
import java.nio.file.Files;
import java.nio.file.Paths;

public class RedefAgent {
    public static void agentmain(String args, Instrumentation inst) throws Exception {
        byte[] bytes = Files.readAllBytes(Paths.get(args));
        for (Class<?> c : inst.getAllLoadedClasses()) {
            if (c.getName().equals("Target")) {
                inst.redefineClasses(new ClassDefinition(c, bytes));
                System.out.println("redefined Target");
                return;
            }
        }
        throw new IllegalStateException("Target is not loaded");
    }
}
"""
LOADER = """\
import com.sun.tools.attach.VirtualMachine;

public class LoadAgent {
    public static void main(String[] args) throws Exception {
        VirtualMachine vm = VirtualMachine.attach(args[0]);
        try {
            vm.loadAgent(args[1], args[2]);
        } finally {
            vm.detach();
        }
        System.out.println("loaded");
    }
}
"""
MANIFEST = "Agent-Class: RedefAgent\nCan-Redefine-Classes: true\n"


def line_of(source: str, marker: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if marker in line)


OLD_LINE = line_of(TARGET_V1, "// OLD")
NEW_LINE = line_of(TARGET_V2, "// NEW")
assert len(TARGET_V1.splitlines()) < NEW_LINE  # no such line in the first version


def build(tmp: Path) -> tuple[Path, Path, Path, Path]:
    """The program (first version), the second version of Target, the agent jar and the
    launcher, compiled into ``tmp``."""
    javac, jar = require_tool("javac"), require_tool("jar")
    sources = {"Redef.java": MAIN, "Target.java": TARGET_V1, "RedefAgent.java": AGENT}
    sources["LoadAgent.java"] = LOADER
    src = tmp / "src"
    (src / "v2").mkdir(parents=True)
    for name, text in sources.items():
        (src / name).write_text(text)
    (src / "v2" / "Target.java").write_text(TARGET_V2)
    app, v2, tools = tmp / "app", tmp / "v2", tmp / "tools"

    def javac_into(out: Path, *files: Path) -> None:
        argv = [javac, "-g", "-d", str(out), *map(str, files)]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)

    javac_into(app, src / "Redef.java", src / "Target.java")
    javac_into(v2, src / "v2" / "Target.java")
    javac_into(tools, src / "RedefAgent.java", src / "LoadAgent.java")
    (tmp / "manifest.txt").write_text(MANIFEST)
    agent = tmp / "agent.jar"
    argv = [jar, "cfm", str(agent), str(tmp / "manifest.txt"), "-C", str(tools), "RedefAgent.class"]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    return app, v2 / "Target.class", agent, tools


@asynccontextmanager
async def run_program(jdk: Jdk, app: Path, port: int) -> AsyncIterator[Jvm]:
    """``Redef`` under ``-agentlib:jdwp=...,suspend=n``, listening and ticking."""
    async with run_jvm(jdk, app, port, main="Redef") as jvm:
        await jvm.wait_counter_above(0)
        yield jvm


# "auto" stays off on a local JVM; "on": foresight kept the first session's class data's keys and
# asks them again when session 2 starts, after the redefinition.
@pytest.mark.parametrize("speculate", ["auto", "on"])
async def test_a_breakpoint_on_a_line_of_the_redefined_class_hits(jdk, tmp_path, speculate):
    app, new_class, agent, tools = await trio.to_thread.run_sync(build, tmp_path)  # javac, jar
    (port,) = free_port_range(1)
    debugger = {"speculate": speculate}
    with trio.fail_after(CAP):
        async with (
            monitor([port], tmp_path, debugger=debugger) as h,
            run_program(jdk, app, port) as jvm,
        ):
            vm = await wait_ready(h, port)

            # Session 1: the first version's line.
            async with jdb_session(jdk, vm["debugger_port"], "before") as jdb:
                await jdb.attached()
                await jdb.until_stopped(
                    f"stop at Target:{OLD_LINE}",
                    rf"Set breakpoint Target:{OLD_LINE}",
                    "Breakpoint hit:",
                    rf'"thread=main", Target\.work\(\), line={OLD_LINE} bci',
                )
                assert await jdb.quit() == 0, jdb.transcript
            await wait_released(h, port, 1)

            # No debugger attached: an agent redefines Target (JDWP says nothing of it).
            argv = [jdk.java, "-cp", str(tools), "LoadAgent", str(jvm.process.pid)]
            with trio.fail_after(WAIT * 3):
                loaded = await trio.run_process(
                    [*argv, str(agent), str(new_class)],
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
            assert loaded.returncode == 0, loaded.stderr.decode()
            await jvm.wait_line(lambda line: line == "redefined Target", "'redefined Target'")
            await jvm.wait_line(lambda line: line.endswith(" 2"), "a tick of the new version")

            # Session 2: a line that exists only in the new version.
            async with jdb_session(jdk, vm["debugger_port"], "after") as jdb:
                await jdb.attached()
                await jdb.until_stopped(
                    f"stop at Target:{NEW_LINE}",
                    rf"Set breakpoint Target:{NEW_LINE}",
                    "Breakpoint hit:",
                    rf'"thread=main", Target\.work\(\), line={NEW_LINE} bci',
                )
                text = await jdb.command("print version", r"\bversion = (\d+)")
                assert "version = 2" in text, text
                assert await jdb.quit() == 0, jdb.transcript
            if speculate == "on":  # session 2 was served locally, and still saw the new lines
                await wait_released(h, port, 2)
                said = [e for e in h.logs if e["event"] == "debugger.foresight"]
                assert said, "no debugger.foresight line: nothing was answered locally"
                assert said[-1]["answered"] > 0
