"""Issues 20 and 31: a plain HotSpot JVM's thread list. ``ddmd threads`` lists jstack's Java
threads, all of them (its thread dump's, the ones JDWP hides included), numbered with jstack's
``#N``; the ids stay the same across polls; ddmd's own JDWP poll goes on alongside, and a
real jdb attached while ddmd polls sees nothing of ddmd's requests (no stray event, its own
ids intact, its breakpoint session as usual)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import trio

from tests.actors.rawpeers import free_port_range, monitor, wait_until
from tests.e2e.conftest import jdk  # noqa: F401 - a fixture, used by name
from tests.e2e.jdbdriver import open_jdb
from tests.e2e.test_bridge_jvm import (
    WAIT,
    breakpoint_session,
    classes,  # noqa: F401 - a fixture, used by name
    run_jvm,
    vm_id,
    wait_ready,
)

pytestmark = pytest.mark.jvm

CAP = 60
JSTACK_THREAD = re.compile(r'^"([^"]+)" #(\d+)', re.MULTILINE)


async def threads(h, port: int) -> list[dict]:
    result = await h.cli("threads", vm_id(port), "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    listed: list[dict] = body["threads"] if isinstance(body, dict) else body
    return listed


async def test_thread_names_match_jstack_and_ids_are_stable(jdk, classes, tmp_path):  # noqa: F811
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h, run_jvm(jdk, classes, port) as jvm:
            await wait_ready(h, port)
            jstack = await trio.run_process(
                [jdk.java.replace("/java", "/jstack"), str(jvm.process.pid)],
                capture_stdout=True,
                stderr=subprocess.STDOUT,
            )
            # Every Java thread jstack lists, with its #N: the compiler's, service and JDWP
            # agent threads too (JDWP's AllThreads hides them; the thread dump does not).
            java_threads = {
                name: int(n) for name, n in JSTACK_THREAD.findall(jstack.stdout.decode())
            }
            java_threads.pop("Attach Listener", None)  # started by the first attach (jstack's)
            assert "main" in java_threads, jstack.stdout.decode()

            async def same_names() -> list[dict] | None:
                listed = await threads(h, port)
                mine = {t["name"]: t["id"] for t in listed if t["name"] != "Attach Listener"}
                return listed if mine == java_threads else None

            first = await wait_until(same_names, WAIT, what="ddmd's threads = jstack's")
            again = await threads(h, port)
            ids = {t["name"]: t["id"] for t in first}
            assert {t["name"]: t["id"] for t in again if t["name"] in ids} == ids
            main = next(t for t in again if t["name"] == "main")
            assert main["java_state"] in ("RUNNABLE", "TIMED_WAITING"), main


async def test_jdb_sees_nothing_of_ddmds_thread_polls(jdk, classes, tmp_path):  # noqa: F811
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with (
            monitor([port], tmp_path, monitor={"always_poll_threads": True}) as h,
            run_jvm(jdk, classes, port) as jvm,
        ):
            vm = await wait_ready(h, port)
            async with open_jdb(jdk.jdb, vm["debugger_port"], name="jdb") as jdb:
                await breakpoint_session(jdb, jvm)
                polled = await threads(h, port)  # ddmd kept polling meanwhile
                assert any(t["name"] == "main" and t["suspended"] for t in polled), polled
                assert await jdb.quit() == 0, jdb.transcript
            # jdb's transcript has only its own session: no event it did not ask for.
            text = jdb.transcript
            assert "Exception occurred" not in text, text
            assert "Thread started" not in text, text
            assert "Thread died" not in text, text
            assert not h.events("ddm.reply_unknown"), h.events("ddm.reply_unknown")
