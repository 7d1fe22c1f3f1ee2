"""Plain JVMs are first-class (issue 20): real HotSpot JVMs started here (this test's uid), in
the scan range of a real ``ddmd.daemon.run``, give their stacks, heap figures, a GC, an HPROF
dump and kill through ddmd's API, judged by the JDK's own tools: ``jstack`` names the same
threads, ``jmap -histo:live`` counts the same instances of the program's own classes,
hprof-conv finds the dump already in the standard format, and the process ends with the exit
status asked for. A JVM started with -XX:+DisableAttachMechanism, and one run as uid 65534,
each get the sentence that says why not, and are never sent SIGQUIT (a JVM prints a thread
dump on its output for a SIGQUIT it does not take as an attach request).
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import trio

from ddmd.protocol.hprof import java_class_name, summarise_file
from tests.actors.needs import skip_or_fail
from tests.actors.rawpeers import Harness, free_port_range, monitor, wait_until
from tests.hotspot.conftest import MAIN_LINE, OWN_CLASSES, WAIT, Jvm, run_quiet, tool
from tests.hprof.test_sim_dump import hprof_conv

pytestmark = pytest.mark.jvm

CAP = 90  # seconds for a whole test
_JSTACK_THREAD = re.compile(r'^"(.*)" (?:#\d+ )?(?:daemon )?(?:prio=\d+ )?os_prio=', re.M)
_HISTO_ROW = re.compile(r"^\s*\d+:\s+(\d+)\s+\d+\s+(\S+)")


@asynccontextmanager
async def watched(
    classes: Path, tmp_path: Path, *, sections: dict[str, Any] | None = None, **jvm: Any
) -> AsyncIterator[tuple[Harness, Jvm]]:
    """Quiet running, and a daemon that found it as a plain JVM with its pid."""
    (port,) = free_port_range(1)
    async with (
        run_quiet(classes, port, **jvm) as running,
        monitor([port], tmp_path, **(sections or {})) as h,
    ):
        await h.wait_vm(
            running.vm_id, lambda v: v["ddm"] is False and v["pid"] is not None, timeout=WAIT
        )
        yield h, running


async def get(h: Harness, path: str, status: int = 200) -> Any:
    response = await h.client.get(path, timeout=60)
    assert response.status_code == status, response.text
    return response.json()


async def post(h: Harness, path: str, status: int = 200) -> Any:
    response = await h.client.post(path, timeout=60)
    assert response.status_code == status, response.text
    return response.json()


async def run(*command: str) -> str:
    done = await trio.run_process(list(command), capture_stdout=True, capture_stderr=True)
    return done.stdout.decode()


def trigger_files(directory: Path) -> list[Path]:
    """.attach_pid files left in the JVM's working directory."""
    return list(directory.glob(".attach_pid*"))


async def jstack_names(pid: int) -> list[str]:
    text = await run(tool("jstack"), str(pid))
    return _JSTACK_THREAD.findall(text.split("\nJNI global refs")[0])


# ------------------------------------------------------------------------------------ stacks


async def test_every_stack_and_one_by_name_as_jstack_sees_them(quiet_classes, tmp_path):
    with trio.fail_after(CAP):
        async with watched(quiet_classes, tmp_path) as (h, jvm):
            vm = f"/api/v1/vms/{jvm.vm_id}"
            body = await get(h, f"{vm}/stacks")
            assert body["source"] == "Thread.print"
            assert body["deadlocked"] is False
            names = [t["name"] for t in body["threads"]]
            assert names == await jstack_names(jvm.process.pid)  # the same threads, in order
            assert {"main", "worker one", "gc watcher", "Attach Listener"} <= set(names)
            assert body["text"].splitlines()[1].startswith("Full thread dump OpenJDK")
            main = next(t for t in body["threads"] if t["name"] == "main")
            assert main["id"] == 1
            assert main["state"] == "wait"
            assert main["frames"][-1] == {
                "class_name": "Quiet",
                "method_name": "main",
                "file_name": "Quiet.java",
                "line": MAIN_LINE,
                "module": None,
                "locks": ["locked <" + main["frames"][-1]["locks"][0].split("<")[1]],
            }

            # One thread by name, exactly or a part of one.
            one = await get(h, f"{vm}/threads/{quote('worker one')}/stack")
            assert (one["thread_name"], one["state"], one["java_state"]) == (
                "worker one", "sleeping", "TIMED_WAITING",
            )  # fmt: skip
            first = one["frames"][0]
            assert (first["class_name"], first["method_name"], first["line"]) == (
                "java.lang.Thread", "sleep", -2,
            )  # fmt: skip
            assert one["text"].startswith('"worker one" #')
            assert (await get(h, f"{vm}/threads/WATCHER/stack"))["thread_name"] == "gc watcher"

            # By the id of ddmd's own thread list (JDWP): its name is looked up in the dump.
            listed = (await get(h, f"{vm}/threads"))["threads"]
            main_id = next(t["id"] for t in listed if t["name"] == "main")
            by_id = await get(h, f"{vm}/threads/{main_id}/stack")
            assert (by_id["thread_id"], by_id["thread_name"], by_id["java_id"]) == (
                main_id, "main", 1,
            )  # fmt: skip

            missing = await get(h, f"{vm}/threads/nosuchthread/stack", 404)
            assert "no thread 'nosuchthread'" in missing["error"]
            assert "1 main" in missing["candidates"]
    assert not jvm.printed("Full thread dump")  # SIGQUIT only ever started the listener


# ------------------------------------------------------------------------------------ heap, gc


async def test_heap_figures_and_a_gc_that_really_runs(quiet_classes, tmp_path):
    with trio.fail_after(CAP):
        async with watched(quiet_classes, tmp_path) as (h, jvm):
            vm = f"/api/v1/vms/{jvm.vm_id}"
            heap = (await get(h, f"{vm}/heap"))["jvm_heap"]
            assert heap["source"] == "GC.heap_info"
            assert heap["collector"] == "G1"
            assert heap["max"] == 256 << 20  # -Xmx256m
            assert 0 < heap["used"] <= heap["committed"] <= heap["max"]
            assert [s["name"] for s in heap["spaces"]] == [
                "garbage-first heap", "Metaspace", "class space",
            ]  # fmt: skip
            assert heap["text"].startswith(" garbage-first heap")

            assert not jvm.printed("collected")
            body = await post(h, f"{vm}/gc")
            assert (body["gc"], body["confirmed"], body["confirmed_by"]) == (
                "done", True, "GC.run",
            )  # fmt: skip
            assert body["jvm_heap"]["collector"] == "G1"
            # The program's weak reference was cleared: a collection ran in the JVM.
            await wait_until(lambda: jvm.printed("collected"), WAIT, what="the GC cleared it")


# ------------------------------------------------------------------------------------ hprof


def jmap_histogram(pid: int) -> dict[str, int]:
    import subprocess

    done = subprocess.run(
        [tool("jmap"), "-histo:live", str(pid)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    counts: dict[str, int] = {}
    for line in done.stdout.splitlines():
        row = _HISTO_ROW.match(line)
        if row:
            name = java_class_name(row[2])
            counts[name] = counts.get(name, 0) + int(row[1])
    assert len(counts) > 50, done.stdout  # the table was read
    return counts


async def test_a_heap_dump_in_the_captures_directory_agrees_with_jmap(quiet_classes, tmp_path):
    converter = hprof_conv()
    with trio.fail_after(CAP):
        async with watched(quiet_classes, tmp_path) as (h, jvm):
            body = await post(h, f"/api/v1/vms/{jvm.vm_id}/hprof")
            jmap = await trio.to_thread.run_sync(jmap_histogram, jvm.process.pid)
            download = await h.client.get(body["download"])
    path = tmp_path / "captures" / body["file"]  # the daemon's captures directory
    assert re.fullmatch(r"Quiet-\d{8}-\d{6}\.hprof", body["file"]), body["file"]
    assert path.stat().st_size == body["bytes"] == len(download.content)
    histogram = body["histogram"]
    assert histogram["format"] == "JAVA PROFILE 1.0.2"  # HotSpot's own, standard format
    ours = {row["class"]: row["instances"] for row in summarise_file(path).to_json()["classes"]}
    for name, count in OWN_CLASSES.items():
        assert (ours.get(name), jmap.get(name)) == (count, count), name
    shown = {row["class"]: row["instances"] for row in histogram["classes"]}
    assert {n: shown[n] for n in OWN_CLASSES if n in shown} == {
        n: c for n, c in OWN_CLASSES.items() if n in shown
    }
    # hprof-conv reads the header and finds nothing to convert: a standard HPROF already.
    converted = tmp_path / "converted.hprof"
    done = await trio.run_process(
        [converter, str(path), str(converted)], capture_stderr=True, check=False
    )
    assert done.returncode != 0
    assert "already in 1.0.2 format" in done.stderr.decode()


# ------------------------------------------------------------------------------------ kill


async def test_kill_ends_the_jvm_with_the_status_asked_for(quiet_classes, tmp_path):
    with trio.fail_after(CAP):
        async with watched(quiet_classes, tmp_path) as (h, jvm):
            profiling = await get(h, f"/api/v1/vms/{jvm.vm_id}/profiling")
            assert profiling["features"]["kill"] == {"available": True, "reason": None}
            assert profiling["features"]["hprof"]["available"] is True
            body = await post(h, f"/api/v1/vms/{jvm.vm_id}/kill?status=3")
            assert body == {"killed": jvm.vm_id, "status": 3}
            with trio.fail_after(WAIT):
                returncode = await jvm.process.wait()
            assert returncode == 3
            await wait_until(
                lambda: h.events("vm.disconnected", vm=jvm.vm_id), WAIT, what="the VM is gone"
            )
        assert h.events("vm.exit_requested", vm=jvm.vm_id, via="JDWP VirtualMachine.Exit")


# ------------------------------------------------------------------------------------ refusals


async def refused(h: Harness, jvm: Jvm) -> str:
    """The one sentence every attach feature answers with (501), the same each time."""
    vm = f"/api/v1/vms/{jvm.vm_id}"
    sentence = (await get(h, f"{vm}/stacks", 501))["error"]
    assert (await get(h, f"{vm}/heap", 501))["error"] == sentence
    assert (await post(h, f"{vm}/gc", 501))["error"] == sentence
    assert (await post(h, f"{vm}/hprof", 501))["error"] == sentence
    assert (await get(h, f"{vm}/threads/main/stack", 501))["error"] == sentence
    offer = (await get(h, f"{vm}/profiling"))["features"]
    assert offer["hprof"] == {"available": False, "reason": sentence, "mode": "attach"}
    assert offer["kill"]["available"] is True  # JDWP, not the attach API
    return str(sentence)


@pytest.mark.parametrize("where", ["command line", "JAVA_TOOL_OPTIONS"])
async def test_a_jvm_that_disabled_attach_says_so(quiet_classes, tmp_path, where):
    flag = "-XX:+DisableAttachMechanism"
    jvm_kw: dict[str, Any] = (
        {"flags": [flag]} if where == "command line" else {"env": {"JAVA_TOOL_OPTIONS": flag}}
    )
    with trio.fail_after(CAP):
        async with watched(quiet_classes, tmp_path, **jvm_kw) as (h, jvm):
            sentence = await refused(h, jvm)
    pid = jvm.process.pid
    said = "its command line" if where == "command line" else "JAVA_TOOL_OPTIONS"
    assert sentence == (
        f"Quiet (pid {pid}) was started with -XX:+DisableAttachMechanism ({said}): it accepts "
        "no attach, from ddmd, jstack or jcmd"
    )
    assert not jvm.printed("Full thread dump")  # no SIGQUIT was sent
    assert not trigger_files(quiet_classes)


async def test_another_user_s_jvm_says_whose_it_is(quiet_classes, tmp_path):
    if os.geteuid() != 0:
        skip_or_fail("running a JVM as uid 65534 needs root (setpriv)")
    setpriv = tool("setpriv")
    prefix = [setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    with trio.fail_after(CAP):
        async with watched(
            quiet_classes,
            tmp_path,
            prefix=prefix,
            sections={"security": {"allowed_uids": [65534]}},  # adopted: shown, not attached
        ) as (h, jvm):
            sentence = await refused(h, jvm)
            java_pid = (await h.vm(jvm.vm_id) or {})["pid"]
    assert re.fullmatch(
        rf"Quiet \(pid {java_pid}\) runs as uid 65534 \(\w+\) and ddmd as uid 0 \(root\): "
        r"ddmd attaches only to its own user's JVMs, even as root \(a heap dump is written by "
        r"the JVM's user\); jstack and jcmd run as that user can",
        sentence,
    ), sentence
    assert not jvm.printed("Full thread dump")
    assert not trigger_files(quiet_classes)
