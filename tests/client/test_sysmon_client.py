"""The system monitor as a DDM client, seen from a raw JDWP connection: its identity, pushed
reports (from a fake /proc, so every figure is known, and from this machine's), reports on
request; and ``ddmd sysmon`` as a process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import trio
from structlog.testing import capture_logs

from ddmd.protocol import ddm
from ddmd.protocol.jdwp import CommandPacket
from ddmd.sysmon import CHUNK_TYPE_CODE, SystemReport, decode_report
from ddmd.sysmon.cli import first_free_port
from ddmd.sysmon.client import APP_NAME, PACKAGE_NAME, SystemMonitor
from ddmd.sysmon.proc import parse_loadavg, parse_meminfo
from tests.actors.rawpeers import free_port_range
from tests.client.rawserver import RawServer, connect, open_raw
from tests.client.test_sysmon_proc import MEMINFO, STAT, fake_proc, linux_only

CAP = 20  # seconds: absolute cap on every test


def report_of(packet_or_chunks: CommandPacket | tuple[ddm.Chunk, ...]) -> SystemReport:
    """The report in a push, or in the chunks of a reply."""
    if isinstance(packet_or_chunks, CommandPacket):
        packet_or_chunks = ddm.chunks_of(packet_or_chunks, ddm.Direction.FROM_VM)
    (chunk,) = packet_or_chunks
    assert isinstance(chunk, ddm.UnknownChunk)
    assert chunk.chunk_type == CHUNK_TYPE_CODE
    return decode_report(chunk.data)


async def test_identity_pushes_and_requests_from_a_fake_proc(nursery, tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, loadavg="0.50 1.25 2.00 1/2 3\n", meminfo=MEMINFO, stat=STAT)
    monitor = SystemMonitor(port=0, interval=0.05, proc=proc)
    with trio.fail_after(CAP):
        port = await nursery.start(monitor.serve)
        async with connect(port) as server:
            (hello,) = await server.reply_chunks("HELO", b"\x00\x00\x00\x01")
            assert isinstance(hello, ddm.HeloReply)
            assert (hello.app_name, hello.package_name, hello.pid) == (
                APP_NAME,
                PACKAGE_NAME,
                os.getpid(),
            )
            assert await server.reply_chunks("FEAT") == (ddm.FeatReply(("SMON",)),)

            # Pushed reports, one every interval, ids of the client's own.
            pushes = [await server.push() for _ in range(3)]
            assert all(p.id & 0x80000000 for p in pushes)
            for packet in pushes:
                report = report_of(packet)
                assert (report.load1, report.load5, report.load15) == (500, 1250, 2000)
                assert (report.mem_total, report.mem_available, report.mem_free) == (
                    24683656,
                    24109488,
                    23763956,
                )
                assert (report.swap_total, report.swap_free) == (2097148, 1048576)
                assert len(report.cpu_busy) == 2  # cpu0 and cpu2 of the fake stat
            # /proc/stat did not change, so no CPU time passed: busy shares are not known.
            assert report_of(pushes[-1]).cpu_busy == (None, None)

            # A report on request: the reply carries it.
            proc.joinpath("loadavg").write_text("3.00 2.00 1.00 1/2 3\n")
            report = report_of(await server.reply_chunks("SMON"))
            assert (report.load1, report.load5, report.load15) == (3000, 2000, 1000)
            assert monitor.reports_answered == 1
            # A request with data is refused with a failure, and the monitor goes on.
            (fail,) = await server.reply_chunks("SMON", b"\x01")
            assert isinstance(fail, ddm.Fail)
            assert "carries no data" in fail.message
            report = report_of(await server.reply_chunks("SMON"))
            assert report.load1 == 3000
    assert monitor.reports_pushed >= 3


@linux_only
async def test_reports_of_this_machine_agree_with_proc(nursery) -> None:
    monitor = SystemMonitor(port=0, interval=0.05)
    with trio.fail_after(CAP):
        port = await nursery.start(monitor.serve)
        async with connect(port) as server:
            await server.push()  # the first report covers the time since the monitor started
            before_load = parse_loadavg(await trio.Path("/proc/loadavg").read_text())
            before_mem = parse_meminfo(await trio.Path("/proc/meminfo").read_text())
            report = report_of(await server.reply_chunks("SMON"))
            after_load = parse_loadavg(await trio.Path("/proc/loadavg").read_text())
            after_mem = parse_meminfo(await trio.Path("/proc/meminfo").read_text())
    assert report.load1 in (round(before_load[0] * 1000), round(after_load[0] * 1000))
    assert report.mem_total == before_mem["MemTotal"] == after_mem["MemTotal"]
    assert report.cpu_period_ms < 60_000
    assert len(report.cpu_busy) >= 1
    assert all(b is None or 0 <= b <= 1000 for b in report.cpu_busy)


def test_first_free_port_skips_listeners_and_ports_held_by_connections() -> None:
    ports = free_port_range(4)
    with socket.socket() as listener, socket.socket() as held:
        listener.bind(("127.0.0.1", ports[0]))
        listener.listen()
        # ports[1]: no listener any more, but a connection still uses it (a VM connected to
        # ddmd closes its listening socket and opens it again later).
        held.bind(("127.0.0.1", ports[1]))
        held.listen()
        client = socket.create_connection(("127.0.0.1", ports[1]))
        accepted, _ = held.accept()
        held.close()
        try:
            assert first_free_port("127.0.0.1", ports) == ports[2]
            assert first_free_port("127.0.0.1", ports[:2]) is None
        finally:
            client.close()
            accepted.close()


async def test_the_sysmon_command_runs_until_sigterm(tmp_path: Path) -> None:
    ports = free_port_range(3)
    config = tmp_path / "config.toml"
    config.write_text(f'[scan]\nports = "{ports[0]}-{ports[-1]}"\n')
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", ports[0]))
        busy.listen()
        command = [sys.executable, "-m", "ddmd", "sysmon", "--interval", "0.1"]
        command += ["--config", str(config), "--log-format", "json"]
        process = await trio.lowlevel.open_process(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            with trio.fail_after(CAP):
                # The first free port of the scan range: ports[0] is taken.
                stream = await open_raw(ports[1])
                async with stream:
                    server = RawServer(stream)
                    for _ in range(2):
                        report_of(await server.push())
                process.send_signal(signal.SIGTERM)
                assert process.stderr is not None
                err = b""
                while chunk := await process.stderr.receive_some(4096):
                    err += chunk
                code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    text = err.decode()
    assert code == 0, text
    assert f"listening on 127.0.0.1:{ports[1]}" in text
    assert "stopped after" in text


async def test_an_unreadable_proc_is_reported_and_tried_again(nursery, tmp_path: Path) -> None:
    monitor = SystemMonitor(port=0, interval=0.05, proc=tmp_path)  # an empty directory
    with capture_logs() as logs, trio.fail_after(CAP):
        port = await nursery.start(monitor.serve)
        async with connect(port) as server:
            (fail,) = await server.reply_chunks("SMON")
            assert isinstance(fail, ddm.Fail)
            assert "loadavg" in fail.message or "stat" in fail.message
            # The files appear: reports follow.
            fake_proc(tmp_path, loadavg="0.50 1.25 2.00 1/2 3\n", meminfo=MEMINFO, stat=STAT)
            assert report_of(await server.push()).load1 == 500
            assert report_of(await server.reply_chunks("SMON")).load5 == 1250
    failures = [e for e in logs if e["event"] == "sysmon.read_failed"]
    assert 1 <= len(failures) <= 2  # at start, then once for the push loop's run of failures
