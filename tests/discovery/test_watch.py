"""The scanner's watch: a port is probed as soon as a listener appears on it, not at the next
scan round; and the watch obeys the same rules as the rounds (one probe per port, no foreign
listener touched, nothing held probed again).

Scan intervals here are a minute long, so a VM found within the test's cap was found by the
watch.
"""

from __future__ import annotations

import os

import pytest
import trio
from structlog.testing import capture_logs

from ddmd.discovery import VmFound
from ddmd.discovery.scan import PortScanner
from ddmd.peers import PeerPolicy
from tests.actors.needs import IN_CI
from tests.actors.rawpeers import PeerConnection, RawPeer, free_port_range, make_config
from tests.test_peers import FOREIGN, ME, CountingListener, FakeTables, listen_row

CAP = 20
LONG = {"interval": 60.0, "backoff_max": 120.0}

needs_tables = pytest.mark.skipif(
    not os.path.exists("/proc/net/tcp") and not IN_CI, reason="needs Linux /proc/net/tcp"
)


async def hold(conn: PeerConnection) -> None:
    await conn.wait_closed()


@needs_tables
async def test_a_listener_that_appears_between_rounds_is_found_at_once(tmp_path) -> None:
    ports = free_port_range(2)
    config = make_config(ports, tmp_path, scan=LONG)
    held: set[int] = set()
    scanner = PortScanner(config, lambda: held, policy=PeerPolicy.from_config(config.security))
    send, receive = trio.open_memory_channel[VmFound](4)
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(scanner.run, send)
            await trio.sleep(0.3)  # the first round is over: the next one is a minute away
            await nursery.start(RawPeer(ports[1], hold).run)
            found = await receive.receive()
            held.add(found.key)
            await found.stream.aclose()
            nursery.cancel_scope.cancel()
    assert found.key == ports[1]
    assert found.process is not None
    assert found.process.pid == os.getpid()


@needs_tables
async def test_the_watch_and_a_round_never_probe_one_port_twice(tmp_path) -> None:
    (port,) = free_port_range(1)
    config = make_config([port], tmp_path, scan=LONG)
    peer = CountingListener(port)
    scanner = PortScanner(config, set, policy=PeerPolicy.from_config(config.security))
    send, _receive = trio.open_memory_channel[VmFound](4)
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.run)  # listening before the scanner starts
            nursery.start_soon(scanner.run, send)
            await trio.sleep(1.0)  # the first round and ten looks of the watch
            nursery.cancel_scope.cancel()
    # The round and the watch's first look both saw the listener; one of them probed it.
    # (It is not JDWP: the probe backs the port off, so nothing probes it again.)
    assert (peer.connections, scanner.probes) == (1, 1)


async def test_the_watch_does_not_touch_another_users_listener(tmp_path) -> None:
    (port,) = free_port_range(1)
    tables = FakeTables(tmp_path / "proc")
    config = make_config([port], tmp_path, scan=LONG)
    scanner = PortScanner(
        config, set, policy=PeerPolicy(frozenset({ME, 0})), proc_root=str(tables.root)
    )
    peer = CountingListener(port)
    send, _receive = trio.open_memory_channel[VmFound](1)
    with capture_logs() as logs, trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.run)
            nursery.start_soon(scanner.watch, send)
            await trio.sleep(0.3)
            tables.add(listen_row(port, FOREIGN))  # the listener appears: another user's
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
    assert (peer.connections, scanner.probes) == (0, 0)
    skipped = [e for e in logs if e["event"] == "scan.foreign_vm_skipped"]
    assert [(e["port"], e["uid"]) for e in skipped] == [(port, FOREIGN)]


async def test_the_watch_probes_an_allowed_listener_once(tmp_path) -> None:
    (port,) = free_port_range(1)
    tables = FakeTables(tmp_path / "proc")
    config = make_config([port], tmp_path, scan=LONG)
    scanner = PortScanner(
        config, set, policy=PeerPolicy(frozenset({ME, 0, FOREIGN})), proc_root=str(tables.root)
    )
    peer = CountingListener(port)
    send, _receive = trio.open_memory_channel[VmFound](1)
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.run)
            nursery.start_soon(scanner.watch, send)
            await trio.sleep(0.3)
            assert peer.connections == 0  # nothing in the tables yet: nothing probed
            tables.add(listen_row(port, FOREIGN))
            await trio.sleep(0.5)  # five looks: the listener is new at the first only
            nursery.cancel_scope.cancel()
    assert (peer.connections, scanner.probes) == (1, 1)


async def test_the_watch_leaves_a_host_name_to_the_rounds(tmp_path) -> None:
    (port,) = free_port_range(1)
    config = make_config([port], tmp_path, scan={**LONG, "host": "localhost"})
    scanner = PortScanner(config, set)
    send, _receive = trio.open_memory_channel[VmFound](1)
    with trio.fail_after(CAP):
        await scanner.watch(send)  # returns at once: the tables hold numeric addresses only
