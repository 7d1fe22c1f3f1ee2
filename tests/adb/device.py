"""A REAL adb server on a private port with a `FakeDevice` (``ddmd.sim.adbd``) connected to it.

    async with open_adb_device(FakeDevice({4242: ("127.0.0.1", jvm.port)}), adb=adb) as rig:
        result = await rig.run_adb("-s", rig.serial, "jdwp")   # the real adb CLI
        rig.device.add_pid(...)                                 # the FakeDevice itself

What `open_adb_device` does, each step with a deadline:

1. picks a free port for the server: never 5037 (someone's own server) and never 5554-5585
   (the ports the server probes for emulators by itself);
2. ``adb -P PORT start-server`` with ``HOME`` set to a temporary directory (the server's RSA
   keys go there) and ``ANDROID_ADB_SERVER_PORT`` / ``ADB_SERVER_SOCKET`` /
   ``ANDROID_ADB_SERVER_ADDRESS`` / ``ANDROID_SDK_HOME`` / ``ANDROID_USER_HOME`` unset;
3. serves the device on a free port (the same rules) and runs
   ``adb -P PORT connect 127.0.0.1:DEVPORT``;
4. waits until ``adb -P PORT devices`` lists ``127.0.0.1:DEVPORT<TAB>device``;

and at exit ``adb -P PORT kill-server`` (then waits for the port to close) and stops the
device. The ``adb`` fixture gives the program's path; a missing ``adb`` skips the test
outside CI and fails it under ``CI=true`` (`tests.actors.needs`).

`hotspot_jvm(jdk, workdir[, port])` runs a real HotSpot JVM (the ``Counter`` program of
``tests/e2e/conftest.py``) with ``-agentlib:jdwp=...,server=y,suspend=n,address=127.0.0.1:0``
(or a fixed port) and reports the port the agent printed: a VM to map a device pid to.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import trio

from ddmd.sim.adbd import FakeDevice
from tests.actors.needs import skip_or_fail
from tests.e2e.conftest import COUNTER_SOURCE, Jdk

__all__ = [
    "ADB_DEFAULT_PORT",
    "EMULATOR_PORTS",
    "AdbDevice",
    "HotSpot",
    "adb",
    "adb_env",
    "hotspot_jvm",
    "open_adb_device",
    "pick_port",
    "require_adb",
]

ADB_DEFAULT_PORT = 5037
#: The server probes these for emulators on its own (console and adb port pairs).
EMULATOR_PORTS = range(5554, 5586)
#: Environment variables that would point adb at another server or another key directory.
_ADB_ENV = (
    "ANDROID_ADB_SERVER_PORT",
    "ANDROID_ADB_SERVER_ADDRESS",
    "ADB_SERVER_SOCKET",
    "ANDROID_SDK_HOME",
    "ANDROID_USER_HOME",
    "ADB_VENDOR_KEYS",
    "ADB_TRACE",
)
ADB_TIMEOUT = 20.0  # seconds: one adb command
READY_TIMEOUT = 20.0  # seconds: the device listed as "device"


def require_adb() -> str:
    """The path of ``adb``; skips (outside CI) or fails (``CI=true``) when it is missing."""
    path = shutil.which("adb")
    if path is None:
        skip_or_fail("the 'adb' program is not installed (Debian: apt install adb)")
    assert path is not None
    return path


@pytest.fixture
def adb() -> str:
    # A plain (sync) fixture: skip/fail reach pytest directly, not through a nursery.
    return require_adb()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def pick_port() -> int:
    """A free loopback port (chosen by the system) that is neither 5037 nor 5554-5585."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port != ADB_DEFAULT_PORT and port not in EMULATOR_PORTS:
            return port
    raise RuntimeError("no free port outside 5037 and 5554-5585")


def adb_env(home: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``HOME`` = ``home`` and the
    variables that would send adb elsewhere removed."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in _ADB_ENV}
    env["HOME"] = str(home)
    return env


@dataclass(frozen=True, slots=True)
class AdbDevice:
    """A running private adb server with a `FakeDevice` online in it."""

    adb: str  # the program
    adb_port: int
    serial: str  # "127.0.0.1:DEVPORT"
    device: FakeDevice
    home: Path  # HOME of the server and of every run_adb (its .android/adbkey)

    @property
    def env(self) -> dict[str, str]:
        """The environment for other programs that talk to this server (no port variable:
        give them ``adb_port`` explicitly)."""
        return adb_env(self.home)

    async def run_adb(
        self, *args: str, patience: float = ADB_TIMEOUT
    ) -> subprocess.CompletedProcess[bytes]:
        """``adb -P ADB_PORT *args``, output captured, never checked (look at returncode);
        TooSlowError after ``patience`` seconds."""
        return await _run_adb(self.adb, self.adb_port, self.home, args, patience)

    async def devices(self) -> dict[str, str]:
        """``adb devices`` as serial -> state."""
        result = await self.run_adb("devices")
        return _parse_devices(result.stdout)


async def _run_adb(
    adb: str, port: int, home: Path, args: tuple[str, ...], patience: float
) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(patience):
        return await trio.run_process(
            [adb, "-P", str(port), *args],
            capture_stdout=True,
            capture_stderr=True,
            stdin=subprocess.DEVNULL,
            check=False,
            env=adb_env(home),
        )


def _parse_devices(out: bytes) -> dict[str, str]:
    found = {}
    for line in out.decode(errors="replace").splitlines()[1:]:
        serial, tab, state = line.partition("\t")
        if tab:
            found[serial.strip()] = state.strip()
    return found


@asynccontextmanager
async def open_adb_device(
    device: FakeDevice | None = None,
    *,
    adb: str | None = None,
    ready_timeout: float = READY_TIMEOUT,
) -> AsyncIterator[AdbDevice]:
    """Start a private adb server, serve ``device`` (default: a `FakeDevice` with no pids),
    connect it, wait for it to be online; kill the server and stop the device at exit."""
    adb = adb or require_adb()
    device = device if device is not None else FakeDevice()
    default_was_listening = _listening(ADB_DEFAULT_PORT)
    with tempfile.TemporaryDirectory(prefix="ddmd-adb-home-") as home_dir:
        home = Path(home_dir)
        adb_port = pick_port()
        try:
            async with trio.open_nursery() as nursery:
                # A port found free may be taken by another program before the server binds
                # it (another suite or a bench on the machine): then take another one.
                for _attempt in range(3):
                    started = await _run_adb(adb, adb_port, home, ("start-server",), ADB_TIMEOUT)
                    if started.returncode == 0:
                        break
                    adb_port = pick_port()
                assert started.returncode == 0, (
                    f"adb -P {adb_port} start-server failed: {started.stderr.decode()}"
                )
                dev_port = await nursery.start(partial(device.serve, pick_port()))
                serial = f"127.0.0.1:{dev_port}"
                rig = AdbDevice(adb, adb_port, serial, device, home)
                connected = await rig.run_adb("connect", serial)
                said = (connected.stdout + connected.stderr).decode(errors="replace")
                assert connected.returncode == 0, said
                assert "connected to" in said, said
                await _wait_online(rig, ready_timeout)
                try:
                    yield rig
                finally:
                    with trio.CancelScope(shield=True):
                        await _kill_server(adb, adb_port, home)
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                if _listening(adb_port):  # start-up failed half way
                    await _kill_server(adb, adb_port, home)
    if not default_was_listening:
        assert not _listening(ADB_DEFAULT_PORT), "something started an adb server on 5037"


async def _wait_online(rig: AdbDevice, patience: float) -> None:
    seen: dict[str, str] = {}
    try:
        with trio.fail_after(patience):
            while True:
                seen = await rig.devices()
                if seen.get(rig.serial) == "device":
                    return
                await trio.sleep(0.1)
    except trio.TooSlowError:
        raise AssertionError(
            f"{rig.serial} not listed as 'device' by the adb server on {rig.adb_port} within "
            f"{patience:g} s; last list: {seen!r}; device: {rig.device.statistics()!r}"
        ) from None


async def _kill_server(adb: str, port: int, home: Path) -> None:
    try:
        await _run_adb(adb, port, home, ("kill-server",), ADB_TIMEOUT)
        with trio.fail_after(10):
            while True:
                if not _listening(port):
                    return
                await trio.sleep(0.05)
    except trio.TooSlowError:
        pass  # reported by the caller's own checks, if it cares


# --------------------------------------------------------------------------------------------
# A real HotSpot JVM to put behind a device pid

_AGENT_PORT = re.compile(rb"Listening for transport dt_socket at address: (\d+)")
JVM_START_TIMEOUT = 60.0  # seconds: compile + start + listening, on a slow machine


@dataclass(frozen=True, slots=True)
class HotSpot:
    """A running ``Counter`` JVM: its JDWP agent's port and its process."""

    port: int
    process: trio.Process


@asynccontextmanager
async def hotspot_jvm(jdk: Jdk, workdir: Path, port: int = 0) -> AsyncIterator[HotSpot]:
    """Compile and start ``Counter`` with the JDWP agent on ``127.0.0.1:PORT``; yield once the
    agent printed its port; kill it at exit.

    With port 0 the agent binds a NEW free port each time it listens again, i.e. after every
    debugger session (it prints another "Listening ..." line): ``HotSpot.port`` is then good
    for the first session only. Give a fixed port for a VM that is attached more than once.
    """
    source = workdir / "Counter.java"
    source.write_text(COUNTER_SOURCE)
    classes = workdir / "classes"
    agent = f"-agentlib:jdwp=transport=dt_socket,server=y,suspend=n,address=127.0.0.1:{port}"
    with trio.fail_after(JVM_START_TIMEOUT):
        compiled = await trio.run_process(
            [jdk.javac, "-d", str(classes), str(source)],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert compiled.returncode == 0, compiled.stderr.decode()
    process = await trio.lowlevel.open_process(
        [jdk.java, agent, "-cp", str(classes), "Counter"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    found = trio.Event()
    seen = bytearray()
    ports: list[int] = []

    async def drain() -> None:
        assert process.stdout is not None
        async for data in process.stdout:
            if not found.is_set():
                seen.extend(data)
                match = _AGENT_PORT.search(seen)
                if match:
                    ports.append(int(match.group(1)))
                    found.set()
        found.set()  # the output ended: the JVM died

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            with trio.fail_after(JVM_START_TIMEOUT):
                await found.wait()
            assert ports, f"the JVM printed no agent port: {seen.decode(errors='replace')}"
            try:
                yield HotSpot(ports[0], process)
            finally:
                process.kill()
                nursery.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()
        with trio.move_on_after(5) as scope:
            scope.shield = True
            await process.wait()
