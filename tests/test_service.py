"""ddmd as a systemd service: sd_notify (ddmd.notify), the unit file, and `ddmd run` under a fake
NOTIFY_SOCKET (READY=1 only once the ports accept connections, STOPPING=1 on SIGTERM, exit 0)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio

from ddmd import notify
from tests.actors.rawpeers import free_port_range, monitor

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "systemd" / "ddmd.service"


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    """A bound AF_UNIX datagram socket, as systemd's; the path is short (sun_path limit)."""
    directory = tempfile.mkdtemp(prefix="ddmd-notify-")
    path = os.path.join(directory, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(path)
        sock.settimeout(30)
        yield sock, path
    finally:
        sock.close()
        shutil.rmtree(directory, ignore_errors=True)


# ------------------------------------------------------------------------------ ddmd.notify


def test_without_notify_socket_nothing_is_sent():
    assert notify.notify("READY=1", env={}) is False
    assert notify.ready("x", env={"NOTIFY_SOCKET": ""}) is False
    assert notify.socket_address({"NOTIFY_SOCKET": "vsock:2:1234"}) is None


def test_ready_and_stopping_reach_a_path_socket(notify_socket):
    sock, path = notify_socket
    env = {"NOTIFY_SOCKET": path}
    assert notify.ready("control API http://127.0.0.1:8710/,\ncurrent-VM port 8700", env=env)
    assert sock.recv(4096) == (
        b"READY=1\nSTATUS=control API http://127.0.0.1:8710/, current-VM port 8700"
    )
    assert notify.stopping(env=env)
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=stopping"


def test_abstract_namespace_socket():
    name = f"ddmd-test-{secrets.token_hex(6)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        assert notify.socket_address({"NOTIFY_SOCKET": "@" + name}) == b"\0" + name.encode()
        assert notify.notify("READY=1", env={"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(4096) == b"READY=1"


def test_a_missing_socket_raises_oserror(tmp_path):
    with pytest.raises(OSError):
        notify.notify("READY=1", env={"NOTIFY_SOCKET": str(tmp_path / "nobody")})


async def test_daemon_logs_a_failed_notification_and_keeps_running(tmp_path, monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody"))
    with trio.fail_after(10):
        async with monitor(free_port_range(1), tmp_path) as h:
            r = await h.client.get("/api/v1/health")
            assert r.status_code == 200
            assert h.events("daemon.notify_failed")


# ------------------------------------------------------------------------------ the unit file


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_unit_is_a_notify_user_service_logging_json():
    s = unit_settings()
    assert s["Type"] == ["notify"]
    assert s["NotifyAccess"] == ["main"]
    assert s["Restart"] == ["on-failure"]
    (exec_start,) = s["ExecStart"]
    assert exec_start.split()[1:] == ["run", "--log-format", "json"]
    assert exec_start.startswith("%h/")  # a user unit: the user's own installation
    assert s["WantedBy"] == ["default.target"]  # the user manager's target
    assert "User" not in s  # meaningless (and refused) in a user unit
    assert s["NoNewPrivileges"] == ["yes"]


def test_systemd_analyze_verify(tmp_path):
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (Debian package 'systemd')")
    # %h/.local/bin/ddmd must exist for verify: a home whose ddmd is this checkout's.
    home = tmp_path / "home"
    (home / ".local" / "bin").mkdir(parents=True)
    wrapper = home / ".local" / "bin" / "ddmd"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m ddmd "$@"\n')
    wrapper.chmod(0o755)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    unit = tmp_path / "ddmd.service"
    shutil.copy(UNIT, unit)
    env = {**os.environ, "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}
    result = subprocess.run(
        [tool, "--user", "verify", str(unit)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    # Any warning (an unknown key, a bad value) is printed; a clean unit prints nothing.
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


# ------------------------------------------------------------------------------ ddmd run


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_ddmd_run_notifies_ready_after_binding_and_stopping_on_sigterm(tmp_path, notify_socket):
    sock, path = notify_socket
    ports = free_port_range(8)
    scan, control, current, debugger = ports[0:2], ports[2], ports[3], ports[4:8]
    config = tmp_path / "config.toml"
    config.write_text(
        f'[scan]\nports = "{scan[0]}-{scan[1]}"\ninterval = 0.2\n'
        f"[control]\nport = {control}\n"
        f'[debugger]\nports = "{debugger[0]}-{debugger[-1]}"\ncurrent_port = {current}\n'
        f'state_file = "{tmp_path / "ports.json"}"\n'
        '[adb]\nenabled = "off"\n'
    )
    env = {
        **os.environ,
        "NOTIFY_SOCKET": path,
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("DDMD_CONFIG", None)
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ddmd", "run", "--config", str(config), "--log-format", "json"],
            stdout=out,
            stderr=err,
            env=env,
            cwd=ROOT,
        )
    try:
        try:
            ready = sock.recv(4096)
        except TimeoutError:
            pytest.fail(f"no READY=1 within 30 s; stderr: {stderr.read_text()}")
        # At the moment READY arrives, both ports must already accept connections, and the
        # control API must answer.
        accepted = {"control": _accepts(control), "current-VM": _accepts(current)}
        health = httpx.get(f"http://127.0.0.1:{control}/api/v1/health", trust_env=False, timeout=5)
        assert ready.split(b"\n")[0] == b"READY=1"
        status = ready.decode().partition("STATUS=")[2]
        assert f"127.0.0.1:{control}" in status
        assert f"current-VM port {current}" in status
        assert accepted == {"control": True, "current-VM": True}
        assert health.status_code == 200
        assert proc.poll() is None

        proc.send_signal(signal.SIGTERM)
        stopping = sock.recv(4096)
        assert stopping.split(b"\n")[0] == b"STOPPING=1"
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert f"ddmd run: using config file {config}" in stderr.read_text()
    events = [json.loads(line)["event"] for line in stdout.read_text().splitlines() if line]
    for name in ("config.loaded", "control.listening", "daemon.started", "daemon.stopped"):
        assert name in events
    # READY=1 is sent after the last of these: both listeners logged before daemon.started.
    assert events.index("control.listening") < events.index("daemon.started")
    assert events.index("debugger.listening") < events.index("daemon.started")
    assert events.index("daemon.signal_received") < events.index("daemon.stopping")
