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
import time
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


# ------------------------------------------------------------------------------ one at a time


def _daemon_config(tmp_path: Path) -> tuple[Path, int, list[int]]:
    """A config on free ports, adb off: (file, control port, scan ports)."""
    ports = free_port_range(8)
    scan, control, current, debugger = ports[0:4], ports[4], ports[5], ports[6:8]
    config = tmp_path / "config.toml"
    config.write_text(
        f'[scan]\nports = "{scan[0]}-{scan[-1]}"\ninterval = 0.2\n'
        f"[control]\nport = {control}\n"
        f'[debugger]\nports = "{debugger[0]}-{debugger[-1]}"\ncurrent_port = {current}\n'
        f'state_file = "{tmp_path / "ports.json"}"\n'
        '[adb]\nenabled = "off"\n'
    )
    return config, control, scan


def _daemon_env(tmp_path: Path, runtime: str = "run") -> dict[str, str]:
    (tmp_path / runtime).mkdir(mode=0o700, exist_ok=True)
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
        "XDG_RUNTIME_DIR": str(tmp_path / runtime),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("DDMD_CONFIG", None)
    env.pop("NOTIFY_SOCKET", None)
    return env


def _start(tmp_path: Path, config: Path, env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
    with (tmp_path / f"{name}.out").open("wb") as out, (tmp_path / f"{name}.err").open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "ddmd", "run", "--config", str(config), "--log-format", "json"],
            stdout=out,
            stderr=err,
            env=env,
            cwd=ROOT,
        )


def _health(control: int, proc: subprocess.Popen[bytes], tmp_path: Path, name: str) -> dict:
    """The daemon's health answer, once it gives one (30 s at most)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = (tmp_path / f"{name}.err").read_text()
            pytest.fail(f"ddmd exited with {proc.returncode}: {log}")
        try:
            r = httpx.get(f"http://127.0.0.1:{control}/api/v1/health", trust_env=False, timeout=2)
            return dict(r.json())
        except httpx.TransportError:
            time.sleep(0.1)
    pytest.fail(f"no health answer on {control} within 30 s")


def _ddmd(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ddmd", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_second_run_or_demo_says_ddmd_is_already_running(tmp_path):
    config, control, scan = _daemon_config(tmp_path)
    env = _daemon_env(tmp_path)
    first = _start(tmp_path, config, env, "first")
    try:
        health = _health(control, first, tmp_path, "first")
        assert health["pid"] == first.pid
        assert health["adb"] == {"enabled": "off", "config": str(config)}
        said = (
            f"ddmd is already running (pid {first.pid}, control 127.0.0.1:{control}); "
            "use that one (e.g. 'ddmd clients'), or stop it first"
        )

        second = _ddmd("run", "--config", str(config), env=env)
        assert second.returncode == 4, second.stderr
        assert second.stderr.splitlines()[-1] == f"ddmd run: {said}"

        demo = _ddmd("demo", "--config", str(config), env=env)
        assert demo.returncode == 4, demo.stderr
        assert demo.stderr.splitlines()[-1] == f"ddmd demo: {said}"
        assert "simulated VMs" not in demo.stderr

        # Without the lock (another runtime directory), the control address still tells.
        elsewhere = _ddmd("run", "--config", str(config), env=_daemon_env(tmp_path, "run2"))
        assert elsewhere.returncode == 4, elsewhere.stderr
        assert elsewhere.stderr.splitlines()[-1] == f"ddmd run: {said}"

        # Nothing was left listening in the scan range, and the first daemon saw no VM.
        assert [p for p in scan if _accepts(p)] == []
        vms = httpx.get(f"http://127.0.0.1:{control}/api/v1/vms", trust_env=False, timeout=5)
        assert vms.json() == []

        # `ddmd devices` says where adb is turned off, instead of an empty table.
        devices = _ddmd("devices", "--control", f"127.0.0.1:{control}", env=env)
        assert devices.returncode == 0, devices.stderr
        assert f'adb is turned off: [adb] enabled = "off" in {config}' in devices.stdout
        listed = _ddmd("devices", "--json", "--control", f"127.0.0.1:{control}", env=env)
        assert json.loads(listed.stdout) == []
        assert first.poll() is None
    finally:
        assert _stop(first) == 0
    events = [
        json.loads(line)["event"] for line in (tmp_path / "first.out").read_text().splitlines()
    ]
    assert "vm.found" not in events


def test_a_daemon_killed_with_sigkill_does_not_block_the_next(tmp_path):
    config, control, _ = _daemon_config(tmp_path)
    env = _daemon_env(tmp_path)
    first = _start(tmp_path, config, env, "first")
    try:
        assert _health(control, first, tmp_path, "first")["pid"] == first.pid
    finally:
        first.kill()  # SIGKILL: no clean-up of any kind
        first.wait(timeout=20)
    assert (tmp_path / "run" / "ddmd" / f"control-{control}.lock").exists()  # left behind
    second = _start(tmp_path, config, env, "second")
    try:
        assert _health(control, second, tmp_path, "second")["pid"] == second.pid
    finally:
        assert _stop(second) == 0
