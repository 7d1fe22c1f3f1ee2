"""The CLI for a plain JVM, through a real daemon and a real HotSpot JVM: ``ddmd stack TARGET``
prints every thread as jstack does (the thread dump itself), ``ddmd stack TARGET THREAD`` one
thread's block, ``ddmd heap`` and ``ddmd gc`` GC.heap_info's figures in words, ``ddmd hprof``
the dump and its histogram (``--convert`` has nothing to do: the file is standard already),
and ``ddmd kill --yes`` ends the process; a JVM that cannot be attached says why (exit 1)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import trio

from ddmd.protocol.hprof import summarise_file
from tests.actors.rawpeers import wait_until
from tests.hotspot.conftest import MAIN_LINE, OWN_CLASSES, WAIT
from tests.hotspot.test_hotspot import CAP, jstack_names, watched

pytestmark = pytest.mark.jvm


async def test_stack_heap_gc_hprof_and_kill_from_the_command_line(quiet_classes, tmp_path):
    with trio.fail_after(CAP):
        async with watched(quiet_classes, tmp_path) as (h, jvm):
            target = str(jvm.process.pid)

            every = await h.cli("stack", target)
            assert every.exit_code == 0, every.output
            head, _, dump = every.stdout.partition("\n")
            assert head == f"threads of VM Quiet ({jvm.vm_id}, pid {target}), from its thread dump:"
            shown = re.findall(r'^"(.*)" (?:#\d+ )?(?:daemon )?(?:prio=\d+ )?os_prio=', dump, re.M)
            assert shown == await jstack_names(jvm.process.pid)
            assert f"\tat Quiet.main(Quiet.java:{MAIN_LINE})" in dump

            one = await h.cli("stack", target, "worker one")
            assert one.exit_code == 0, one.output
            lines = one.stdout.splitlines()
            assert re.fullmatch(r"thread \d+ \(worker one\) of VM Quiet \(.*\):", lines[0])
            assert lines[1].startswith('"worker one" #')
            assert lines[2] == "   java.lang.Thread.State: TIMED_WAITING (sleeping)"

            heap = await h.cli("heap", target)
            assert heap.exit_code == 0, heap.output
            lines = heap.stdout.splitlines()
            assert lines[0] == (
                f"heap of VM Quiet ({jvm.vm_id}, pid {target}), from GC.heap_info (G1 collector):"
            )
            assert re.fullmatch(
                r"Java heap: [\d.]+ [KM]iB used of [\d.]+ MiB committed, at most 256\.0 MiB",
                lines[1],
            ), lines[1]
            assert re.fullmatch(
                r"Metaspace: .* used of .* committed, [\d.]+ GiB reserved", lines[2]
            )
            assert lines[3].startswith("    class space: ")

            gc = await h.cli("gc", target)
            assert gc.exit_code == 0, gc.output
            assert gc.stdout.startswith(f"GC done on Quiet ({jvm.vm_id}, pid {target}) (GC.run): ")
            await wait_until(lambda: jvm.printed("collected"), WAIT, what="the GC cleared it")

            dumped = await h.cli("hprof", target, "-o", str(tmp_path), "--convert", "--top", "0")
            assert dumped.exit_code == 0, dumped.output
            assert "JAVA PROFILE 1.0.2" in dumped.stdout
            assert "is a standard HPROF already (HotSpot's): nothing to convert" in dumped.stdout
            as_json = await h.cli("hprof", target, "-o", str(tmp_path), "--top", "0", "--json")
            assert as_json.exit_code == 0, as_json.output
            written = Path(json.loads(as_json.stdout)["path"])
            assert written.parent == tmp_path
            rows = summarise_file(written).to_json()["classes"]
            assert {r["class"]: r["instances"] for r in rows if r["class"] in OWN_CLASSES} == (
                OWN_CLASSES
            )

            killed = await h.cli("kill", target, "--yes", "--status", "5")
            assert killed.exit_code == 0, killed.output
            assert killed.stdout.strip() == (
                f"killed Quiet ({jvm.vm_id}, pid {target}) (exit status 5)"
            )
            with trio.fail_after(WAIT):
                assert await jvm.process.wait() == 5


async def test_a_jvm_that_cannot_be_attached_says_why_on_the_command_line(quiet_classes, tmp_path):
    flag = "-XX:+DisableAttachMechanism"
    with trio.fail_after(CAP):
        async with watched(quiet_classes, tmp_path, flags=[flag]) as (h, jvm):
            target = str(jvm.process.pid)
            for command in (["stack", target], ["heap", target], ["gc", target],
                            ["hprof", target, "-o", str(tmp_path)]):  # fmt: skip
                result = await h.cli(*command)
                assert result.exit_code == 1, (command, result.output)
                assert "-XX:+DisableAttachMechanism (its command line)" in result.stderr, command
