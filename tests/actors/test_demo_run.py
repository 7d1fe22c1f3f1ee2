"""Issue 20, friction 4: `ddmd demo` shows its own hints, last, and leaves no adb server behind.

``ddmd demo`` runs as a user runs it: a subprocess (``python -m ddmd demo``) with a config file
of free ports, its stdout and stderr read through one pipe (what a terminal shows, in order),
stopped with SIGINT. Checked: the commands to try and the web page's address come last, once the
daemon has found and named the three VMs; the log stays at warning level unless ``-v``; the
demo starts no adb server when adb is "auto", and stops the one it started when adb is "on".
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.actors.needs import skip_or_fail
from tests.actors.rawpeers import free_port_range

STARTUP = 30.0  # seconds for the hints to appear
QUIET = 1.5  # seconds of silence expected after the hints
NAMES = {"com.example.mail", "com.example.notes", "com.example.maps:remote"}
HINTS_END = "# Or open the web page: "


class Demo:
    """A running ``ddmd demo``: its merged output, line by line, as it comes."""

    def __init__(self, proc: subprocess.Popen[bytes], control_port: int) -> None:
        self.proc = proc
        self.control_port = control_port
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self._lock:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def wait_for(self, prefix: str, timeout: float) -> int:
        """The index of the first line starting with ``prefix``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, line in enumerate(self.snapshot()):
                if line.startswith(prefix):
                    return i
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no line {prefix!r}; output:\n" + "\n".join(self.snapshot()))

    def stop(self) -> list[str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise AssertionError("ddmd demo did not stop on SIGINT") from None
        self._reader.join(timeout=5)
        return self.snapshot()


def _own_ports(avoid: list[int]) -> list[int]:
    while True:
        ports = free_port_range(12)  # 9 debugger ports: 3 VMs and the device's 3 apps
        if ports[-1] < avoid[0] or ports[0] > avoid[-1]:
            return ports


def write_config(tmp_path: Path, adb: str = "") -> tuple[Path, int]:
    scan = free_port_range(6)
    control, current, front, *debugger = _own_ports(scan)
    config = tmp_path / "demo.toml"
    config.write_text(
        f"""
[scan]
ports = "{scan[0]}-{scan[-1]}"
interval = 0.2

[debugger]
ports = "{debugger[0]}-{debugger[-1]}"
current_port = {current}
state_file = "{tmp_path / "ports.json"}"

[control]
port = {control}

[front]
port = {front}

[timeouts]
ddm_request = 1.0
{adb}
"""
    )
    return config, control


@contextmanager
def demo(tmp_path: Path, *args: str, adb: str = "", path: str | None = None) -> Iterator[Demo]:
    config, control = write_config(tmp_path, adb)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "DDMD_CONFIG": str(config)}
    env.pop("ANDROID_ADB_SERVER_PORT", None)
    if path is not None:
        env["PATH"] = path
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddmd", "demo", "--config", str(config), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=tmp_path,
    )
    running = Demo(proc, control)
    try:
        yield running
    finally:
        running.stop()


def named_vms(port: int) -> set[str]:
    body = httpx.get(f"http://127.0.0.1:{port}/api/v1/vms", timeout=5, trust_env=False).json()
    return {vm["app"] for vm in body if vm.get("state") == "ready"}


def json_lines(lines: list[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in lines if line.startswith("{")]


# ------------------------------------------------------------------------------ hints


def test_the_hints_come_last_once_the_vms_are_named_and_the_log_shows_warnings_only(tmp_path):
    with demo(tmp_path, "--log-format", "json") as running:
        end = running.wait_for(HINTS_END, STARTUP)
        # By the time the hints are printed, ddmd lists the three VMs by name.
        assert named_vms(running.control_port) >= NAMES
        time.sleep(QUIET)
        shown = running.snapshot()
        lines = running.stop()
    # Nothing follows the hints while the demo runs: they stay on the screen.
    assert len(shown) == end + 1, shown[end:]
    assert (
        shown[end]
        == f"{HINTS_END}http://127.0.0.1:{running.control_port}/  (Ctrl-C here stops the demo)"
    )
    start = shown.index("# In another terminal, try:")
    hints = shown[start:end]
    assert hints[1].startswith("ddmd clients")
    assert hints[-1].startswith("jdb -attach localhost:")
    assert shown[start - 1].startswith("ddmd demo: 3 simulated VMs on 127.0.0.1 ports ")
    assert "control API" not in "\n".join(shown)
    # Warning level: no info (or debug) line, before or after the hints.
    levels = {entry["level"] for entry in json_lines(lines)}
    assert levels <= {"warning", "error"}, levels
    assert lines[-1] != "", lines
    assert running.proc.returncode in (0, 130)


def test_verbose_shows_the_log_and_still_prints_the_hints_after_the_vms_are_named(tmp_path):
    with demo(tmp_path, "-v", "--log-format", "json") as running:
        end = running.wait_for(HINTS_END, STARTUP)
        shown = running.snapshot()
    start = shown.index("# In another terminal, try:")
    before = json_lines(shown[:start])
    assert {entry["level"] for entry in before} >= {"info"}
    # Each VM was named (HELO, and the Dalvik app's later APNM) before the hints.
    named = {str(e["app"]) for e in before if e["event"] in ("vm.hello", "vm.renamed")}
    assert named >= NAMES, named
    assert shown[end].startswith(HINTS_END)


# ------------------------------------------------------------------------------ adb


def test_with_adb_auto_the_demo_runs_adb_only_for_its_own_private_server(tmp_path):
    """The demo needs no device of the user's: with the default [adb] enabled = "auto" it runs
    the adb program only for the simulated device's private server (``-P PORT``, never 5037).
    An adb that fails leaves the demo as it was without adb: no device, adb off."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "adb-calls"
    fake = bin_dir / "adb"
    fake.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\nexit 1\n')
    fake.chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    with demo(tmp_path, "-v", "--log-format", "json", path=path) as running:
        running.wait_for(HINTS_END, STARTUP)
        shown = running.snapshot()
    for call in calls.read_text().splitlines():
        words = call.split()
        assert words[0] == "-P", call
        assert words[1] != "5037", call
    text = "\n".join(shown)
    assert "ddmd demo: no simulated Android device: adb -P " in text
    assert "adb off (no device needed)" not in text
    started = json_lines(shown)
    assert not [e for e in started if str(e["event"]).startswith(("adb.", "front."))]
    assert next(e for e in started if e["event"] == "daemon.started")["adb"] == "off"


def adb_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            conn.sendall(b"000chost:version")
            conn.settimeout(2)
            return conn.recv(4) == b"OKAY"
    except OSError:
        return False


def wait_answers(port: int, want: bool, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if adb_answers(port) is want:
            return True
        time.sleep(0.1)
    return False


def test_with_adb_on_the_demo_stops_the_adb_server_it_started(tmp_path):
    program = shutil.which("adb")
    if program is None:
        skip_or_fail("the 'adb' program is not installed (Debian: apt install adb)")
    (adb_port,) = free_port_range(1)
    assert not adb_answers(adb_port)
    section = f'[adb]\nenabled = "on"\nport = {adb_port}\npath = "{program}"\n'
    try:
        with demo(tmp_path, adb=section) as running:
            running.wait_for(HINTS_END, STARTUP)
            # ddmd started a server for the demo (no device is needed to see it answer).
            assert wait_answers(adb_port, True, 15), "the demo's ddmd started no adb server"
            lines = running.stop()
        assert running.proc.returncode in (0, 130), lines
        assert wait_answers(adb_port, False, 5), "the adb server the demo started still runs"
        assert f"ddmd demo: stopped the adb server it started (127.0.0.1:{adb_port})" in lines
    finally:
        if adb_answers(adb_port):  # never leave one behind, even when the test fails
            subprocess.run([program, "-P", str(adb_port), "kill-server"], check=False)


def test_with_adb_on_a_server_that_ran_before_the_demo_is_left_alone(tmp_path):
    program = shutil.which("adb")
    if program is None:
        skip_or_fail("the 'adb' program is not installed (Debian: apt install adb)")
    (adb_port,) = free_port_range(1)
    env = {**os.environ, "ANDROID_ADB_SERVER_PORT": str(adb_port)}
    subprocess.run([program, "-P", str(adb_port), "start-server"], check=True, env=env)
    try:
        assert wait_answers(adb_port, True, 10)
        section = f'[adb]\nenabled = "on"\nport = {adb_port}\npath = "{program}"\n'
        with demo(tmp_path, adb=section) as running:
            running.wait_for(HINTS_END, STARTUP)
            lines = running.stop()
        assert adb_answers(adb_port), "the demo stopped an adb server it had not started"
        assert not [line for line in lines if "stopped the adb server" in line]
    finally:
        subprocess.run([program, "-P", str(adb_port), "kill-server"], check=False, env=env)


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch, tmp_path):
    home = tmp_path / "home"  # no user config; adb keeps its keys in ~/.android
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
