"""Real HotSpot JVMs in the scan range are named the way ``jps`` names them.

Two copies of the Counter program run with the JDWP agent on neighbouring ports of the test
daemon's scan range: one as ``java -cp classes Counter``, one as ``java -jar app.jar`` (a jar
built here with the ``jar`` tool). HotSpot tells nothing about itself over JDWP, so their pid
and name come from /proc: ``ddmd clients --json`` must show each one's real pid (the pid of the
process this test started) with ``Counter`` and ``app.jar`` as the app, and ``ddmd select``
must accept both a pid and a main class (checked through GET /api/v1/current each time).
"""

from __future__ import annotations

import json
import subprocess
from functools import partial
from pathlib import Path

import pytest
import trio

from tests.actors.rawpeers import free_port_range, monitor
from tests.e2e.conftest import COUNTER_SOURCE, START_CAP, CounterJvm, Jdk, require_tool

pytestmark = pytest.mark.jvm

CAP = 60  # seconds for the whole test, JVM start-up included


async def build(jdk: Jdk, jar_tool: str, work: Path) -> tuple[Path, Path]:
    """Compile Counter into work/classes and pack it into work/app.jar (Main-Class: Counter)."""
    source = work / "Counter.java"
    source.write_text(COUNTER_SOURCE)
    classes, jar = work / "classes", work / "app.jar"
    pack = ["--create", "--file", str(jar), "--main-class", "Counter", "-C", str(classes), "."]
    for command in ([jdk.javac, "-d", str(classes), str(source)], [jar_tool, *pack]):
        result = await trio.run_process(command, capture_stdout=True, capture_stderr=True)
        assert result.returncode == 0, result.stderr.decode()
    return classes, jar


async def start_jvm(
    nursery: trio.Nursery, started: list[CounterJvm], java: str, port: int, args: list[str]
) -> CounterJvm:
    agent = f"-agentlib:jdwp=transport=dt_socket,server=y,suspend=n,address=127.0.0.1:{port}"
    process: trio.Process = await nursery.start(
        partial(
            trio.run_process,
            [java, agent, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            check=False,
        )
    )
    jvm = CounterJvm(port, process)
    started.append(jvm)
    nursery.start_soon(jvm.read_output)
    return jvm


async def test_plain_jvms_have_their_pid_and_main_class(jdk: Jdk, tmp_path: Path) -> None:
    jar_tool = require_tool("jar")
    class_port, jar_port = free_port_range(2)
    class_id, jar_id = f"tcp:{class_port}", f"tcp:{jar_port}"
    started: list[CounterJvm] = []
    async with trio.open_nursery() as jvms:
        try:
            with trio.fail_after(CAP):
                with trio.fail_after(START_CAP):
                    classes, jar = await build(jdk, jar_tool, tmp_path)
                    by_class = await start_jvm(
                        jvms, started, jdk.java, class_port, ["-cp", str(classes), "Counter"]
                    )
                    by_jar = await start_jvm(jvms, started, jdk.java, jar_port, ["-jar", str(jar)])
                    await by_class.listening.wait()
                    await by_jar.listening.wait()
                async with monitor([class_port, jar_port], tmp_path) as h:
                    await check(h, class_id, by_class, jar_id, by_jar)
        finally:
            for jvm in started:
                jvm.process.kill()
            jvms.cancel_scope.cancel()


async def check(h, class_id: str, by_class: CounterJvm, jar_id: str, by_jar: CounterJvm) -> None:
    for vm_id in (class_id, jar_id):
        await h.wait_vm(vm_id, lambda v: v["ddm"] is False and v["pid"] is not None, timeout=15)

    result = await h.cli("clients", "--json")
    assert result.exit_code == 0, result.output
    listed = {vm["id"]: vm for vm in json.loads(result.output)}
    assert set(listed) == {class_id, jar_id}, listed
    assert listed[class_id]["pid"] == by_class.process.pid
    assert listed[class_id]["app"] == "Counter"
    assert listed[jar_id]["pid"] == by_jar.process.pid
    assert listed[jar_id]["app"] == "app.jar"
    assert by_class.process.pid != by_jar.process.pid

    async def current() -> str | None:
        response = await h.client.get("/api/v1/current")
        assert response.status_code == 200, response.text
        vm = response.json()["vm"]
        return None if vm is None else vm["id"]

    assert await current() is None  # two VMs, none chosen yet

    for target, expected in (
        (str(by_jar.process.pid), jar_id),
        ("Counter", class_id),
        ("app.jar", jar_id),
        (str(by_class.process.pid), class_id),
    ):
        result = await h.cli("select", target)
        assert result.exit_code == 0, f"select {target}: {result.output}"
        assert await current() == expected, f"after select {target}"
