"""Issue 31, item 1: `ddmd demo` with adb installed runs a simulated Android device.

``ddmd demo`` runs as a user runs it (a subprocess, a config file of free ports, its own HOME),
then the hints it prints are followed with the real programs: ``adb -P FRONT devices`` lists
the device, ``ddmd logcat APP`` streams the app's live lines, ``adb shell demo crash APP``
gives a crash block, a restart separator and one ``app.crashed`` event, and ``jdb`` through a
front forward (``adb forward tcp:L jdwp:PID``) hits a breakpoint in the device's JVM app. After
SIGINT the demo exits 130 and leaves no process and no listening port behind.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.actors.needs import skip_or_fail
from tests.actors.test_demo_run import HINTS_END, Demo, write_config

STARTUP = 60.0  # seconds: the hints (the JVM app compiles its source first)
WAIT = 20.0  # seconds: one thing to happen
APP = "com.example.chat"
OTHER_APP = "com.example.shop"  # the demo's other simulated app


class Lines:
    """A subprocess's merged output, line by line, read by a thread."""

    def __init__(self, args: list[str], env: dict[str, str], *, stdin: bool = False) -> None:
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            env=env,
        )
        self.lines: list[str] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(lambda: self.proc.stdout.readline(), b""):  # type: ignore[union-attr]
            with self._lock:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def wait_for(self, pattern: str, timeout: float = WAIT) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.snapshot():
                if re.search(pattern, line):
                    return line
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r}:\n" + "\n".join(self.snapshot()))

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` now (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def needs(program: str) -> str:
    import shutil

    path = shutil.which(program)
    if path is None:
        skip_or_fail(f"the {program!r} program is not installed")
    assert path is not None
    return path


def test_the_demo_device_streams_crashes_debugs_and_leaves_nothing_behind(tmp_path):
    adb, jdb = needs("adb"), needs("jdb")
    needs("java")
    config, _control = write_config(tmp_path)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "DDMD_CONFIG": str(config)}
    env.pop("ANDROID_ADB_SERVER_PORT", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddmd", "demo", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=tmp_path,
    )
    running = Demo(proc, _control)
    helpers: list[Lines] = []
    try:
        running.wait_for(HINTS_END, STARTUP)
        text = "\n".join(running.snapshot())
        front = int(re.search(r"^adb -P (\d+) devices$", text, re.M).group(1))  # type: ignore[union-attr]
        adb_port = int(re.search(r"private adb server on port (\d+)", text).group(1))  # type: ignore[union-attr]
        serial = re.search(r"simulated Android device (\S+) with", text).group(1)  # type: ignore[union-attr]
        forward = re.search(r"^adb -P \d+ forward tcp:(\d+) jdwp:(\d+)$", text, re.M)
        assert forward is not None, text
        assert f"ddmd logcat {APP}" in text
        assert "ddmd events --type app.crashed" in text
        assert front != 5037
        assert adb_port != 5037

        def run(*args: str) -> str:
            done = subprocess.run(args, capture_output=True, env=env, timeout=WAIT, check=False)
            return (done.stdout + done.stderr).decode(errors="replace")

        # adb through ddmd's front lists the simulated device.
        assert f"{serial}\tdevice" in run(adb, "-P", str(front), "devices")

        ddmd = [sys.executable, "-m", "ddmd"]
        logcat = Lines([*ddmd, "logcat", APP, "--json"], env)
        events = Lines([*ddmd, "events", "--type", "app.crashed", "--json"], env)
        helpers += [logcat, events]
        logcat.wait_for(r"\"tag\":\"ChatSync\"")
        first = len(logcat.snapshot())
        # live: another line comes while logcat runs
        deadline = time.monotonic() + WAIT
        while len(logcat.snapshot()) == first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "ChatSync" in logcat.snapshot()[-1], logcat.snapshot()
        said = run(adb, "-P", str(front), "shell", "demo", "crash", APP)
        assert f"demo: crash {APP}" in said, said
        logcat.wait_for(r"\"kind\":\"restart\"")
        items = [json.loads(line) for line in logcat.snapshot() if line.startswith("{")]
        crash = [i for i in items if i.get("crash") == "java"]
        assert crash, items
        assert crash[0]["message"].startswith("FATAL EXCEPTION"), items
        assert any("IllegalStateException" in i["message"] for i in crash), crash
        events.wait_for(r'"app.crashed"')
        # One event per crash: another app's crash, read after it from the same log, marks the
        # point by which a second event of the first would have come.
        run(adb, "-P", str(front), "shell", "demo", "crash", OTHER_APP)
        events.wait_for(rf'"app.crashed".*{OTHER_APP}|{OTHER_APP}.*"app.crashed"')
        crashed = [line for line in events.snapshot() if "app.crashed" in line]
        assert [APP in line for line in crashed] == [True, False], crashed

        # jdb through a front forward hits a breakpoint in the device's JVM app.
        local, pid = forward.group(1), forward.group(2)
        run(adb, "-P", str(front), "forward", f"tcp:{local}", f"jdwp:{pid}")
        debugger = Lines([jdb, "-attach", f"localhost:{local}"], env, stdin=True)
        helpers.append(debugger)
        debugger.wait_for(r"Initializing jdb|>")
        debugger.send("stop in DemoCounter.tick\n")
        debugger.wait_for(r"Breakpoint hit: .*DemoCounter\.tick")
        debugger.send("clear DemoCounter.tick\ncont\nquit\n")
        debugger.proc.wait(timeout=WAIT)

        for helper in helpers:
            helper.stop()
        started = descendants(proc.pid)
        assert started, "the demo runs no process of its own (the adb server, the JVM)"
    finally:
        for helper in helpers:
            helper.stop()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            raise AssertionError("ddmd demo did not stop on SIGINT") from None
    assert proc.returncode == 130, running.snapshot()[-10:]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        [p for p in started if alive(p)] or listening(adb_port) or listening(front)
    ):
        time.sleep(0.1)
    assert not [p for p in started if alive(p)], "processes the demo started are left"
    assert not listening(adb_port), "the demo's adb server still runs"
    assert not listening(front), "the demo's adb front still listens"
    assert not listening(int(serial.rpartition(":")[2])), "the simulated device still listens"


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
