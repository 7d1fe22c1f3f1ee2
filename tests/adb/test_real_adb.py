"""The real ``adb`` program (Debian package ``adb``): ddmd against a server on a PRIVATE port.

Never the default port 5037, never a server these tests did not start: each test picks a free
port, and only kills the server it (or ddmd) started there. Skipped, with the reason, where
``adb`` is not installed. No device is attached here, so the device list is empty.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from tests.actors.needs import skip_or_fail
from tests.actors.rawpeers import free_port, free_port_range, monitor, wait_until

CAP = 40  # seconds: absolute cap on every test
ADB_DEFAULT_PORT = 5037


@pytest.fixture
def adb() -> str:
    path = shutil.which("adb")
    if path is None:
        skip_or_fail("the 'adb' program is not installed (Debian: apt install adb)")
    return path


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


async def _adb(adb: str, port: int, *args: str) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(20):
        return await trio.run_process(
            [adb, "-P", str(port), *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={**os.environ, "ANDROID_ADB_SERVER_PORT": str(port)},
        )


@asynccontextmanager
async def private_port(adb: str) -> AsyncIterator[int]:
    """A free port for an adb server of our own; whatever server runs there at the end was
    started by the test (or by ddmd under test) and is killed."""
    port = free_port()
    assert port != ADB_DEFAULT_PORT
    assert not _listening(port)
    default_was_listening = _listening(ADB_DEFAULT_PORT)
    try:
        yield port
    finally:
        with trio.CancelScope(shield=True):
            if _listening(port):
                await _adb(adb, port, "kill-server")
    if not default_was_listening:
        assert not _listening(ADB_DEFAULT_PORT), "something started an adb server on 5037"


async def test_ddmd_starts_a_private_adb_server_then_shuts_down_cleanly(adb, tmp_path):
    with trio.fail_after(CAP):
        async with private_port(adb) as port:
            async with monitor(
                free_port_range(1),
                tmp_path,
                adb={"enabled": "on", "port": port, "path": adb},
                timeouts={"adb": 10.0},
            ) as h:
                starting = await h.wait_event("adb.server_starting", timeout=15)
                assert starting["port"] == port
                connected = await h.wait_event("adb.connected", timeout=15)
                assert connected["started_by_ddmd"] is True
                assert connected["version"] > 0
                assert connected["server"] == f"127.0.0.1:{port}"
                result = await h.cli("devices", "--json")
                assert result.exit_code == 0, result.output
                assert json.loads(result.output) == []
                assert not h.events("adb.unavailable")
                assert not h.events("adb.lost")
                assert not h.events("adb.protocol_error")
            # ddmd stopped; the server it started stays (as adb's own servers do) until
            # `adb kill-server`, which then ends it.
            assert _listening(port)
            killed = await _adb(adb, port, "kill-server")
            assert killed.returncode == 0, killed.stderr
            await wait_until(lambda: not _listening(port), 10, what="the adb server gone")


async def test_ddmd_uses_a_running_adb_server_and_leaves_it_alone(adb, tmp_path):
    with trio.fail_after(CAP):
        async with private_port(adb) as port:
            started = await _adb(adb, port, "start-server")
            assert started.returncode == 0, started.stderr
            async with monitor(
                free_port_range(1),
                tmp_path,
                # No program ddmd could run: it must use the server that is there.
                adb={"enabled": "on", "port": port, "path": str(tmp_path / "no-adb")},
                timeouts={"adb": 10.0},
            ) as h:
                connected = await h.wait_event("adb.connected", timeout=15)
                assert connected["started_by_ddmd"] is False
                response = await h.client.get("/api/v1/devices")
                assert response.json() == []
            assert not h.events("adb.server_starting")
            assert not h.events("adb.lost")
            assert _listening(port)  # ddmd never stops a server
            listed = await _adb(adb, port, "devices")
            assert listed.returncode == 0, listed.stderr
            assert b"List of devices attached" in listed.stdout
