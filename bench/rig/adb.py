"""A private real adb server for the benches that need Debian's ``adb``: started on its own
port with its own HOME (adb's keys) and no adb port variables, never 5037; a fake device
daemon adopted by it; ``adb`` commands against it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

from .children import Child
from .proc import find_adb_server

#: What would send the adb client or server elsewhere (tests/adb/device.py's list).
ADB_ENV = (
    "ANDROID_ADB_SERVER_PORT",
    "ANDROID_ADB_SERVER_ADDRESS",
    "ADB_SERVER_SOCKET",
    "ANDROID_SDK_HOME",
    "ANDROID_USER_HOME",
    "ADB_VENDOR_KEYS",
    "ADB_TRACE",
)


def adb_env(home: Path) -> dict[str, str]:
    """This process's environment without the adb port variables, with HOME = ``home``."""
    env = {k: v for k, v in os.environ.items() if k not in ADB_ENV}
    env["HOME"] = str(home)
    return env


class AdbServer:
    """``adb -P PORT ...`` against a private server; ``home`` (None: this process's
    environment as it is) is the HOME of every adb command and so of the server."""

    def __init__(self, port: int, home: Path | None = None) -> None:
        self.port = port
        self.env = None if home is None else adb_env(home)
        self.pid = 0

    def run(self, *args: str, timeout: float = 30.0) -> str:
        done = subprocess.run(
            ["adb", "-P", str(self.port), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            stdin=subprocess.DEVNULL,
        )
        if done.returncode:
            raise RuntimeError(f"adb -P {self.port} {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout.strip()

    def start(self) -> int:
        """``adb start-server``; returns the server's pid."""
        self.run("start-server")
        self.pid = find_adb_server(self.port)
        return self.pid

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.run("kill-server")

    def adopt(self, device: Child, timeout: float) -> str:
        """The serial of the fake device daemon ``device`` (it prints ``device SERIAL ready``)
        once the server lists it online."""
        serial = device.wait_match(r"^device (\S+) ready", timeout)[1].group(1)
        deadline = time.monotonic() + timeout
        while f"{serial}\tdevice" not in self.run("devices"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{serial} not online in the adb server")
            time.sleep(0.1)
        return serial

    def forward(self, serial: str, pid: int, local: str = "tcp:0") -> int:
        """``adb -s SERIAL forward tcp:0 jdwp:PID``: the local port."""
        return int(self.run("-s", serial, "forward", local, f"jdwp:{pid}"))
