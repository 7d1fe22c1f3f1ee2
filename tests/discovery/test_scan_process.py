"""The port scan names the process behind each VM it finds, without ever waiting long for /proc.

The peers here run in the test process itself, so the real lookup must find this process's pid
(and no name: pytest is not a Java launcher). A stalled lookup must not hold up discovery.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import trio

from ddmd.discovery import VmFound
from ddmd.discovery.scan import PortScanner
from ddmd.host.localproc import LocalProcess
from tests.actors.needs import IN_CI
from tests.actors.rawpeers import PeerConnection, RawPeer, free_port_range, make_config

CAP = 20  # seconds for each test


async def hold(conn: PeerConnection) -> None:
    await conn.wait_closed()


async def scan_one(tmp_path, **scanner_kw: Any) -> tuple[VmFound, int]:
    """Start a RawPeer, scan its port once, return what the scan found and the port."""
    (port,) = free_port_range(1)
    config = make_config([port], tmp_path)
    scanner = PortScanner(config, set, **scanner_kw)
    send, receive = trio.open_memory_channel[VmFound](1)
    async with trio.open_nursery() as nursery:
        await nursery.start(RawPeer(port, hold).run)
        async with send, receive:
            await scanner.scan_once(send)
            found = receive.receive_nowait()
        await found.stream.aclose()
        nursery.cancel_scope.cancel()
    return found, port


@pytest.mark.skipif(
    not os.path.exists("/proc/net/tcp") and not IN_CI, reason="needs Linux /proc/net/tcp"
)
async def test_scan_finds_the_process_behind_the_port(tmp_path) -> None:
    with trio.fail_after(CAP):
        found, port = await scan_one(tmp_path)
    assert found.vm_id == f"tcp:{port}"
    assert found.process is not None, "the listener is this very process"
    assert found.process.pid == os.getpid()
    assert found.process.uid == os.getuid()
    assert found.process.name is None  # python, not a Java launcher


async def test_scan_asks_with_the_probe_connection(tmp_path) -> None:
    calls: list[tuple[Any, ...]] = []
    answer = LocalProcess(pid=4242, uid=1000, name="Main", cmdline=("java", "Main"))

    def lookup(host: str, port: int, **kw: Any) -> LocalProcess:
        calls.append((host, port, kw))
        return answer

    with trio.fail_after(CAP):
        found, port = await scan_one(tmp_path, lookup=lookup)
    assert found.process == answer
    ((host, asked_port, kw),) = calls
    assert (host, asked_port) == ("127.0.0.1", port)
    client_host, client_port = kw["client"]
    assert client_host == "127.0.0.1"
    assert client_port != port
    assert isinstance(kw["give_up_at"], float)


async def test_a_stalled_lookup_does_not_stall_discovery(tmp_path) -> None:
    release = threading.Event()
    entered = threading.Event()

    def stuck(host: str, port: int, **kw: Any) -> LocalProcess:
        entered.set()
        release.wait(CAP)  # a /proc that does not answer
        return LocalProcess(pid=1, uid=0, name="late", cmdline=())

    try:
        with trio.fail_after(CAP):
            found, _ = await scan_one(tmp_path, lookup=stuck)
        assert entered.is_set()
        assert found.process is None  # the VM is found all the same, just without a process
    finally:
        release.set()
