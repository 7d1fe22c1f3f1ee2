"""The demo's simulated Android device: a private adb server (its own port, never 5037; its own
``HOME`` for its keys) that adopts a `FakeDevice` running three debuggable apps which log live
lines and can be restarted or crashed on request.

    device = DemoDevice(adb="/usr/bin/adb", java="/usr/bin/java")
    info: DeviceInfo = await nursery.start(device.run)   # adb port, serial, the apps
    ... adb -P ADB_PORT shell demo crash com.example.chat ...

The apps: two simulated ART VMs (`SimVm`, on free loopback ports outside any scan range) and,
when ``java`` is given, one real HotSpot JVM (``DemoCounter``, started from its source file).
The simulated VMs answer DDM and enough JDWP for ``jdb -attach``, but have no code to stop in:
a breakpoint needs a real VM, so the JVM is the app to set one in (``stop in DemoCounter.tick``).

Requests, as a shell command on the device (``adb shell demo ...``): ``demo crash APP`` (a Java
exception), ``demo native-crash APP`` (SIGSEGV and its tombstone), ``demo anr APP``, ``demo
restart APP``; ``demo`` alone lists the apps. A crash or a restart ends the process (its pid
leaves ``adb jdwp``) and starts it again a second later under a new pid, as Android does.

At exit: the JVM is killed, the adb server is told ``kill-server`` and the device stops.

Layer: the simulator; imports trio, the standard library and ``ddmd.sim`` only.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import trio

from ddmd.sim.adbd import FakeDevice
from ddmd.sim.config import SimConfig
from ddmd.sim.vm import SimVm

__all__ = ["APPS", "JVM_APP", "DemoDevice", "DeviceInfo", "log_record", "pick_port"]

#: The simulated apps: (process name, first pid).
APPS = (("com.example.chat", 5101), ("com.example.shop", 5201))
#: The app backed by a real JVM (when ``java`` is there): breakpoints work in it.
JVM_APP = ("com.example.counter", 5301)
#: Seconds: one adb command; the device listed online; the JVM's agent listening.
ADB_TIMEOUT = 20.0
READY_TIMEOUT = 20.0
JVM_TIMEOUT = 60.0
#: Seconds between an app's live lines; between a death and the new process.
LINE_EVERY = 2.0
RESTART_AFTER = 1.0
_ADB_ENV = (
    "ANDROID_ADB_SERVER_PORT",
    "ANDROID_ADB_SERVER_ADDRESS",
    "ADB_SERVER_SOCKET",
    "ANDROID_SDK_HOME",
    "ANDROID_USER_HOME",
    "ADB_VENDOR_KEYS",
    "ADB_TRACE",
)
_AGENT_PORT = re.compile(rb"Listening for transport dt_socket at address: (\d+)")
_SYSTEM_PID = 600  # system_server: ActivityManager's lines
_CRASH_DUMP_PID = 690  # crash_dump: the tombstone
_LEVELS = {"V": 2, "D": 3, "I": 4, "W": 5, "E": 6, "F": 7}
_BUFFERS = {"main": 0, "system": 3, "crash": 4}

JVM_SOURCE = """\
public class DemoCounter {
    static long count;

    static void tick() {
        count++;
    }

    public static void main(String[] args) throws Exception {
        while (true) {
            tick();
            Thread.sleep(250);
        }
    }
}
"""


def pick_port() -> int:
    """A free loopback port that is neither 5037 (the user's adb server) nor 5554-5585 (the
    ports an adb server probes for emulators)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port != 5037 and not 5554 <= port <= 5585:
            return port
    raise OSError("no free loopback port outside 5037 and 5554-5585")


def log_record(
    pid: int, tag: str, message: str, *, level: str = "I", buffer: str = "main", tid: int = 0
) -> bytes:
    """One ``logcat -B`` entry (v4 header, stamped now)."""
    body = bytes([_LEVELS[level]]) + tag.encode() + b"\0" + message.encode() + b"\0"
    now = time.time_ns()
    head = struct.pack(
        "<HHiIIIII",
        len(body),
        28,
        pid,
        tid or pid,
        now // 1_000_000_000,
        now % 1_000_000_000,
        _BUFFERS[buffer],
        10_000 + pid % 1000,
    )
    return head + body


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """The running device: the private adb server's port, the device's serial, and the app
    to set a breakpoint in (None without ``java``)."""

    adb_port: int
    serial: str
    apps: tuple[str, ...]
    jvm_app: str | None


@dataclass(slots=True)
class _App:
    name: str
    pid: int
    port: int = 0  # where jdwp:PID goes
    scope: trio.CancelScope | None = None  # the simulated VM's, None for the JVM
    lines: int = 0
    started: float = field(default_factory=time.monotonic)


class DemoDevice:
    """The device, its apps and the private adb server that adopts it (`run`)."""

    def __init__(self, adb: str, java: str | None = None) -> None:
        self.adb = adb
        self.java = java
        self.device = FakeDevice()
        self.apps: dict[str, _App] = {}
        self._nursery: trio.Nursery | None = None
        self.device.shell_commands["demo"] = self._command

    async def run(self, *, task_status: trio.TaskStatus[DeviceInfo]) -> None:
        """Start everything, report `DeviceInfo`, run until cancelled, then stop it all."""
        with tempfile.TemporaryDirectory(prefix="ddmd-demo-") as tmp:
            home = Path(tmp)
            adb_port = pick_port()
            try:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    await self._start_server(home, adb_port)
                    for name, pid in APPS:
                        await self._start_sim(name, pid)
                    jvm_app = None
                    if self.java is not None:
                        port = await nursery.start(self._run_jvm, home)
                        name, pid = JVM_APP
                        self._add(_App(name, pid, port))
                        jvm_app = name
                    dev_port = await nursery.start(partial(self.device.serve, pick_port()))
                    serial = f"127.0.0.1:{dev_port}"
                    said = await self._adb(home, adb_port, "connect", serial)
                    if "connected to" not in said:
                        raise OSError(f"adb connect {serial} failed: {said.strip()}")
                    await self._wait_online(home, adb_port, serial)
                    nursery.start_soon(self._chatter)
                    task_status.started(DeviceInfo(adb_port, serial, tuple(self.apps), jvm_app))
                    await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await self._kill_server(home, adb_port)

    # ----------------------------------------------------------------- the adb server

    async def _adb(self, home: Path, port: int, *args: str) -> str:
        env = {k: v for k, v in os.environ.items() if k not in _ADB_ENV}
        env["HOME"] = str(home)
        with trio.fail_after(ADB_TIMEOUT):
            done = await trio.run_process(
                [self.adb, "-P", str(port), *args],
                capture_stdout=True,
                capture_stderr=True,
                stdin=subprocess.DEVNULL,
                check=False,
                env=env,
            )
        return (done.stdout + done.stderr).decode(errors="replace")

    async def _start_server(self, home: Path, port: int) -> None:
        said = await self._adb(home, port, "start-server")
        if not _listening(port):
            raise OSError(f"adb -P {port} start-server failed: {said.strip()}")

    async def _wait_online(self, home: Path, port: int, serial: str) -> None:
        with trio.fail_after(READY_TIMEOUT):
            while True:
                if f"{serial}\tdevice" in await self._adb(home, port, "devices"):
                    return
                await trio.sleep(0.1)

    async def _kill_server(self, home: Path, port: int) -> None:
        if not _listening(port):
            return
        with trio.move_on_after(ADB_TIMEOUT):
            await self._adb(home, port, "kill-server")
            while True:
                if not _listening(port):
                    return
                await trio.sleep(0.05)

    # ----------------------------------------------------------------- the apps

    def _add(self, app: _App) -> None:
        self.apps[app.name] = app
        self.device.add_pid(app.pid, "127.0.0.1", app.port, name=app.name)
        self._log(
            _SYSTEM_PID,
            "ActivityManager",
            f"Start proc {app.pid}:{app.name}/u0a{app.pid % 1000} for activity",
            buffer="system",
        )

    async def _start_sim(self, name: str, pid: int) -> None:
        assert self._nursery is not None
        scope = trio.CancelScope()
        config = SimConfig(pid=pid, app_name=name, package_name=name, churn_interval=0)

        async def serve(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                await SimVm(config).run(task_status=task_status)

        port = await self._nursery.start(serve)
        self._add(_App(name, pid, port, scope))

    async def _run_jvm(self, home: Path, *, task_status: trio.TaskStatus[int]) -> None:
        assert self.java is not None
        source = home / "DemoCounter.java"
        source.write_text(JVM_SOURCE)
        port = pick_port()
        agent = f"-agentlib:jdwp=transport=dt_socket,server=y,suspend=n,address=127.0.0.1:{port}"
        process = await trio.lowlevel.open_process(
            [self.java, agent, str(source)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            assert process.stdout is not None
            seen = b""
            with trio.fail_after(JVM_TIMEOUT):
                async for data in process.stdout:
                    seen += data
                    if _AGENT_PORT.search(seen):
                        break
            if not _AGENT_PORT.search(seen):
                raise OSError(f"the demo JVM did not start: {seen.decode(errors='replace')}")
            task_status.started(port)
            async for _ in process.stdout:  # its agent prints a line per debugger session
                pass
            await trio.sleep_forever()
        finally:
            process.kill()
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await process.wait()

    async def _chatter(self) -> None:
        """Every app logs a line every `LINE_EVERY` seconds, each on its own beat."""
        while True:
            for app in list(self.apps.values()):
                app.lines += 1
                self._log(app.pid, _TAGS.get(app.name, "Demo"), _line(app.name, app.lines))
            await trio.sleep(LINE_EVERY)

    def _log(
        self, pid: int, tag: str, message: str, *, level: str = "I", buffer: str = "main"
    ) -> None:
        self.device.log(log_record(pid, tag, message, level=level, buffer=buffer))

    # ----------------------------------------------------------------- requests

    def _command(self, words: list[str]) -> bytes:
        """``demo WHAT APP``, run by the device's shell."""
        usage = (
            "usage: demo crash|native-crash|anr|restart APP\napps: "
            + " ".join(f"{a.name} (pid {a.pid})" for a in self.apps.values())
            + "\n"
        )
        if len(words) != 2 or words[0] not in _REQUESTS:
            return usage.encode()
        app = self.apps.get(words[1])
        if app is None:
            return f"demo: no app {words[1]!r}\n{usage}".encode()
        _REQUESTS[words[0]](self, app)
        return f"demo: {words[0]} {app.name} (pid {app.pid})\n".encode()

    def _java_crash(self, app: _App) -> None:
        lines = [
            "FATAL EXCEPTION: main",
            f"Process: {app.name}, PID: {app.pid}",
            "java.lang.IllegalStateException: the demo asked for a crash",
            f"\tat {app.name}.MainActivity.onClick(MainActivity.java:42)",
            "\tat android.view.View.performClick(View.java:7448)",
            "\tat android.os.Handler.handleCallback(Handler.java:938)",
            "\tat android.os.Looper.loop(Looper.java:223)",
        ]
        for text in lines:
            self._log(app.pid, "AndroidRuntime", text, level="E", buffer="crash")
        self._die(app)

    def _native_crash(self, app: _App) -> None:
        self._log(
            app.pid,
            "libc",
            f"Fatal signal 11 (SIGSEGV), code 1 (SEGV_MAPERR), fault addr 0x0 in tid "
            f"{app.pid} ({app.name}), pid {app.pid} ({app.name})",
            level="F",
        )
        for text in (
            "*** *** *** *** *** *** *** *** *** *** *** *** *** *** *** ***",
            "Build fingerprint: 'ddmd/ddmdsim/ddmdsim:11/DEMO/1:userdebug/test-keys'",
            f"pid: {app.pid}, tid: {app.pid}, name: main  >>> {app.name} <<<",
            "signal 11 (SIGSEGV), code 1 (SEGV_MAPERR), fault addr 0x0",
            "backtrace:",
            "      #00 pc 000000000001a2b4  /data/app/lib/x86_64/libdemo.so (crash_me+20)",
        ):
            self._log(_CRASH_DUMP_PID, "DEBUG", text, level="F", buffer="crash")
        self._die(app)

    def _anr(self, app: _App) -> None:
        self._log(
            _SYSTEM_PID,
            "ActivityManager",
            f"ANR in {app.name} ({app.name}/.MainActivity)\nPID: {app.pid}\n"
            "Reason: Input dispatching timed out (the demo asked for an ANR)",
            level="E",
            buffer="system",
        )

    def _restart(self, app: _App) -> None:
        self._die(app)

    def _die(self, app: _App) -> None:
        self._log(
            _SYSTEM_PID,
            "ActivityManager",
            f"Process {app.name} (pid {app.pid}) has died",
            buffer="system",
        )
        self.device.remove_pid(app.pid)
        if app.scope is not None:
            app.scope.cancel()
        assert self._nursery is not None
        self._nursery.start_soon(self._start_again, app)

    async def _start_again(self, app: _App) -> None:
        await trio.sleep(RESTART_AFTER)
        pid = app.pid + 1
        if app.scope is None:  # the JVM goes on; only its device pid is new
            self._add(_App(app.name, pid, app.port))
        else:
            await self._start_sim(app.name, pid)


_REQUESTS: dict[str, Callable[[DemoDevice, _App], None]] = {
    "crash": DemoDevice._java_crash,
    "native-crash": DemoDevice._native_crash,
    "anr": DemoDevice._anr,
    "restart": DemoDevice._restart,
}
_TAGS = {
    "com.example.chat": "ChatSync",
    "com.example.shop": "Cart",
    "com.example.counter": "Counter",
}


def _line(app: str, n: int) -> str:
    if app == "com.example.chat":
        return f"synced {n % 7 + 1} messages (round {n})"
    if app == "com.example.shop":
        return f"cart refreshed: {n % 4} items (round {n})"
    return f"counter tick {n}"


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
