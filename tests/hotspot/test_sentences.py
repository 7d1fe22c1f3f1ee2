"""The sentences of a JVM ddmd cannot attach to, for the cases no real JVM here can show: a
VM on another computer, one whose process ddmd does not know, a process that exited or whose
pid now belongs to another program, one that does not catch SIGQUIT; and what happens when a
process never opens its attach socket (a fake ``/proc``, a real process that ignores the
signal). The real JVMs' cases are in test_hotspot.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from ddmd.config import parse_config
from ddmd.drive.jvmtools import JvmTools
from ddmd.hotspot.client import AttachClient, AttachUnavailable, ProcessFacts, refusal
from ddmd.protocol.hsattach import parse_proc_status
from ddmd.registry import VmSnapshot

STATUS = "Name:\tjava\nNSpid:\t{pid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t0\t0\t0\t0\n" \
    "SigIgn:\t0000000000000000\nSigCgt:\t{cgt}\n"  # fmt: skip


class Owner:
    """A VmDriver as JvmTools sees it: a snapshot, nothing else used here."""

    capture_dir = Path("/nonexistent")

    def __init__(self, address: str, pid: int | None = None) -> None:
        self._snapshot = VmSnapshot(
            id="tcp:8000", source="tcp", address=address, state="ready", ddm=False, pid=pid
        )

    def snapshot(self) -> VmSnapshot:
        return self._snapshot

    async def stack_trace(self, thread_id: int) -> object:
        raise AssertionError("not a DDM VM")

    async def refresh_threads(self) -> VmSnapshot:
        return self._snapshot


def tools(address: str) -> JvmTools:
    config = parse_config({}, source="test")
    return JvmTools(Owner(address), process=None, address=address, config=config)


def test_a_jvm_on_another_computer() -> None:
    jvm = tools("10.1.2.3:8000")
    assert jvm.refusal() == (
        "JVM at 10.1.2.3:8000 is not on this computer: the HotSpot attach API (what jstack and "
        "jcmd use) reaches only JVMs on the same computer"
    )
    assert jvm.offer()["hprof"] == {"available": False, "reason": jvm.refusal(), "mode": "attach"}


@pytest.mark.parametrize("address", ["127.0.0.1:8000", "[::1]:8000", "localhost:8000"])
def test_a_local_jvm_whose_process_is_not_known(address) -> None:
    assert tools(address).refusal() == (
        f"ddmd does not know which process JVM at {address} is, so it cannot use the HotSpot "
        "attach API (what jstack and jcmd use) with it"
    )


async def test_every_call_says_the_same() -> None:
    jvm = tools("10.1.2.3:8000")
    for call in (jvm.heap, jvm.cause_gc, jvm.dump_hprof, jvm.stacks):
        with pytest.raises(AttachUnavailable) as caught:
            await call()
        assert str(caught.value) == jvm.refusal()


def facts(uid: int = 0, cgt: str = "0000000000000004", cmdline: tuple[str, ...] = ("java",)):
    status = parse_proc_status(STATUS.format(pid=42, uid=uid, cgt=cgt))
    return ProcessFacts(status, cmdline)


def test_refusals_in_words() -> None:
    who = "Quiet (pid 42)"
    assert refusal(facts(), who, euid=0) is None
    assert refusal(ProcessFacts(None), who, euid=0) == "Quiet (pid 42) has exited"
    # The pid now belongs to another program: the process found by the scan is gone.
    assert refusal(facts(cmdline=("sleep", "9")), who, euid=0, expected_cmdline=("java",)) == (
        "Quiet (pid 42) has exited"
    )
    assert refusal(facts(uid=1000), who, euid=1001) == (
        "Quiet (pid 42) runs as uid 1000"
        + (f" ({_name(1000)})" if _name(1000) else "")
        + " and ddmd as uid 1001"
        + (f" ({_name(1001)})" if _name(1001) else "")
        + ": a JVM lets only its own user attach; jstack and jcmd run as that user can"
    )
    assert refusal(facts(cgt="0000000000000000"), who, euid=0) == (
        "Quiet (pid 42) does not handle SIGQUIT (a JVM started with -Xrs, or not a HotSpot "
        "JVM): its attach listener cannot be started without stopping it"
    )


def _name(uid: int) -> str | None:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


CATCHER = """\
import signal, time
signal.signal(signal.SIGQUIT, lambda *a: print("quit", flush=True))
print("ready", flush=True)
time.sleep(60)
"""


def fake_proc(proc: Path, pid: int) -> Path:
    """A /proc entry for ``pid`` with its own cwd and /tmp (nothing of the real one)."""
    entry = proc / str(pid)
    (entry / "cwd").mkdir(parents=True)
    (entry / "root" / "tmp").mkdir(parents=True)
    (entry / "status").write_text(STATUS.format(pid=pid, uid=os.geteuid(), cgt="0000000000000004"))
    (entry / "cmdline").write_bytes(b"java\0Quiet\0")
    return entry


async def test_a_process_that_never_opens_the_socket_is_given_up_on_in_time(tmp_path) -> None:
    # A real process that takes SIGQUIT (and does nothing with it), under a fake /proc whose
    # entry points at it: the .attach_pid file is made and removed, SIGQUIT sent twice.
    catcher = await trio.lowlevel.open_process(
        [sys.executable, "-c", CATCHER], stdout=subprocess.PIPE
    )
    assert catcher.stdout is not None
    output = b""
    try:
        with trio.fail_after(10):
            while b"ready" not in output:
                output += await catcher.stdout.receive_some()
        entry = fake_proc(tmp_path / "proc", catcher.pid)
        client = AttachClient(catcher.pid, proc=tmp_path / "proc", start_timeout=0.5)
        with trio.fail_after(5), pytest.raises(AttachUnavailable) as caught:
            await client.execute("Quiet (pid 1)", "jcmd", "Thread.print", patience=5)
        assert str(caught.value) == (
            "Quiet (pid 1) did not open its attach socket within 0.5 s of SIGQUIT (its attach "
            "listener may be disabled, or the JVM is hung)"
        )
        assert entries(entry / "cwd") == []  # the trigger file is gone again
    finally:
        catcher.send_signal(signal.SIGTERM)
        with trio.fail_after(5):
            async for data in catcher.stdout:
                output += data
            await catcher.wait()
    assert output.count(b"quit") == 2


def entries(directory: Path) -> list[Path]:
    return list(directory.iterdir())
