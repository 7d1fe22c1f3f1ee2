"""``ddmd threads`` of a plain JVM, judged by ``jstack`` on the same real HotSpot JVM (issue 31):
the same Java threads (jstack's ``#N`` is the ID), each thread's daemon flag and its
java.lang.Thread.State, the JVM's own threads (no ``#N``) named as left out; ``ddmd stack
JVM N`` takes the ID the list shows. A JVM that cannot be attached keeps ddmd's JDWP list,
whose DAEMON column says it does not know (an explicit dash, not a blank)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest
import trio

from tests.actors.rawpeers import Harness, wait_until
from tests.hotspot.conftest import WAIT, tool
from tests.hotspot.test_hotspot import CAP, run, watched

pytestmark = pytest.mark.jvm

_HEAD = re.compile(r'^"(?P<name>.*)" (?:#(?P<n>\d+) )?(?P<daemon>daemon )?(?:prio=\d+ )?os_prio=')
_STATE = re.compile(r"^\s+java\.lang\.Thread\.State: (?P<state>[A-Z_]+)")


@dataclass
class JstackThread:
    name: str
    number: int | None
    daemon: bool
    state: str | None = None


async def jstack(pid: int) -> list[JstackThread]:
    """Every thread of ``jstack PID``, with its #N, daemon flag and Thread.State."""
    text = (await run(tool("jstack"), str(pid))).split("\nJNI global refs")[0]
    threads: list[JstackThread] = []
    for line in text.splitlines():
        head = _HEAD.match(line)
        state = _STATE.match(line)
        if head:
            n = head["n"]
            threads.append(
                JstackThread(head["name"], None if n is None else int(n), bool(head["daemon"]))
            )
        elif state and threads:
            threads[-1].state = state["state"]
    return threads


async def jdwp_list(h: Harness, vm_id: str) -> None:
    """Until ddmd's own JDWP poll has listed the JVM's threads."""

    async def listed() -> bool:
        await h.client.get(f"/api/v1/vms/{vm_id}/threads", timeout=60)  # starts a poll
        body = (await h.client.get(f"/api/v1/vms/{vm_id}", timeout=60)).json()
        return bool(body["threads"])

    await wait_until(listed, WAIT, what="ddmd's JDWP thread list")


#: Threads whose state changes with who asks (the attach listener serves jstack and ddmd).
_BUSY = {"Attach Listener"}


async def test_the_thread_list_agrees_with_jstack(quiet_classes, tmp_path):
    with trio.fail_after(CAP):
        async with watched(quiet_classes, tmp_path) as (h, jvm):
            target = str(jvm.process.pid)
            await jdwp_list(h, jvm.vm_id)  # ddmd's own list first: its ids are not jstack's
            result = await h.cli("threads", target, "--json")
            assert result.exit_code == 0, result.output
            body = json.loads(result.stdout)
            seen = await jstack(jvm.process.pid)

            java = [t for t in seen if t.number is not None]
            own = [t.name for t in seen if t.number is None]
            assert own  # a JDK 17 JVM: GC and VM threads,
            assert len(java) >= 12  # and a dozen Java ones
            listed = {t["id"]: t for t in body["threads"]}
            assert sorted(listed) == sorted(t.number for t in java)  # every Java thread, by #N
            for t in java:
                mine = listed[t.number]
                assert (mine["name"], mine["daemon"]) == (t.name, t.daemon), t
                if t.name not in _BUSY:
                    assert mine["java_state"] == t.state, t
            assert body["left_out"]["count"] == len(own)
            assert sorted(body["left_out"]["names"]) == sorted(own)

            text = await h.cli("threads", target)
            assert text.exit_code == 0, text.output
            lines = text.stdout.splitlines()
            assert "from its thread dump (IDs as jstack's #N)" in lines[0]
            rows = {int(line.split()[0]): line for line in lines[2:] if line[:1].isdigit()}
            assert sorted(rows) == sorted(t.number for t in java)
            for t in java:
                assert (" daemon " in rows[t.number]) == t.daemon, rows[t.number]
            worker = next(t for t in java if t.name == "worker one")
            assert "timed-wait (TIMED_WAITING)" in rows[worker.number]
            assert lines[-1].startswith(f"(left out: {len(own)} threads, the JVM's own threads")
            assert "VM Thread" in lines[-1]


async def test_stack_takes_the_number_the_list_shows(quiet_classes, tmp_path):
    with trio.fail_after(CAP):
        async with watched(quiet_classes, tmp_path) as (h, jvm):
            vm = f"/api/v1/vms/{jvm.vm_id}"
            await jdwp_list(h, jvm.vm_id)
            listed = (await h.client.get(f"{vm}/threads", timeout=60)).json()["threads"]
            for thread in listed:
                one = await h.cli("stack", str(jvm.process.pid), str(thread["id"]))
                assert one.exit_code == 0, one.output
                block = one.stdout.splitlines()[1]
                assert block.startswith(f'"{thread["name"]}" #{thread["id"]} '), block


async def test_a_jvm_that_cannot_be_attached_says_daemon_unknown(quiet_classes, tmp_path):
    with trio.fail_after(CAP):
        async with watched(quiet_classes, tmp_path, flags=["-XX:+DisableAttachMechanism"]) as (
            h,
            jvm,
        ):
            await jdwp_list(h, jvm.vm_id)
            result = await h.cli("threads", str(jvm.process.pid))
            assert result.exit_code == 0, result.output
            lines = result.stdout.splitlines()
            rows = [line for line in lines[2:] if line[:1].isdigit()]
            assert rows
            assert all(" \u2014 " in row for row in rows), rows
            assert lines[-1].startswith("(left out: JDWP lists no thread of the JVM itself")
            assert "-XX:+DisableAttachMechanism" in lines[-1]
