"""ddmd.instance: the lock file and the health check behind "ddmd is already running"."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ddmd import instance
from ddmd.config import parse_config
from ddmd.instance import AlreadyRunning, Running

ROOT = Path(__file__).resolve().parent.parent


def config_for(port: int):
    return parse_config({"control": {"port": port}}, source="t.toml", env={"HOME": "/home/u"})


def nobody(host: str, port: int, token: str) -> Running | None:
    return None


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    return {"XDG_RUNTIME_DIR": str(tmp_path / "run")}


def test_the_lock_names_its_holder_and_blocks_a_second_claim(env):
    config = config_for(9810)
    with instance.claim(config, env, check=nobody) as held:
        assert held.lock == Path(env["XDG_RUNTIME_DIR"]) / "ddmd" / "control-9810.lock"
        assert held.problem is None
        assert json.loads(held.lock.read_text()) == {
            "pid": os.getpid(),
            "control": "127.0.0.1:9810",
        }
        assert oct(held.lock.parent.stat().st_mode & 0o777) == oct(0o700)
        with pytest.raises(AlreadyRunning) as info:
            instance.claim(config, env, check=nobody)
        assert str(info.value).startswith(
            f"ddmd is already running (pid {os.getpid()}, control 127.0.0.1:9810); "
        )
        assert info.value.pid == os.getpid()
        # Another control port is another daemon.
        with instance.claim(config_for(9811), env, check=nobody):
            pass
    # Released: a new claim goes through.
    with instance.claim(config, env, check=nobody):
        pass


def test_a_daemon_answering_at_the_control_address_counts(env):
    asked = []

    def answering(host: str, port: int, token: str) -> Running | None:
        asked.append((host, port, token))
        return Running(pid=777)

    config = parse_config(
        {"control": {"port": 9812, "token": "s3cret"}}, source="t.toml", env={"HOME": "/h"}
    )
    with pytest.raises(AlreadyRunning) as info:
        instance.claim(config, env, check=answering)
    assert "(pid 777, control 127.0.0.1:9812)" in str(info.value)
    assert asked == [("127.0.0.1", 9812, "s3cret")]
    # The refused claim did not keep the lock.
    with instance.claim(config, env, check=nobody):
        pass


def test_a_daemon_with_an_unknown_pid_is_still_named(env):
    with pytest.raises(AlreadyRunning) as info:
        instance.claim(config_for(9813), env, check=lambda h, p, t: Running(pid=None))
    assert str(info.value).startswith("ddmd is already running (control 127.0.0.1:9813); ")


_HOLDER = """
import sys, time
from ddmd import instance
from ddmd.config import parse_config
config = parse_config({"control": {"port": int(sys.argv[1])}}, source="t", env={"HOME": "/h"})
held = instance.claim(config, check=lambda h, p, t: None)
print("held", flush=True)
time.sleep(60)
"""


def test_a_lock_left_by_kill_9_does_not_block(env):
    """The kernel drops a flock(2) lock with its process; the file left behind says nothing."""
    config = config_for(9814)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, "9814"],
        env={**os.environ, **env},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(AlreadyRunning) as info:
            instance.claim(config, env, check=nobody)
        assert info.value.pid == holder.pid
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    path = instance.lock_path(config, env)
    assert json.loads(path.read_text())["pid"] == holder.pid  # the stale record is still there
    with instance.claim(config, env, check=nobody) as held:
        assert json.loads(path.read_text())["pid"] == os.getpid()
        assert held.lock == path


def test_lock_dir_without_xdg_runtime_dir_is_per_user():
    assert instance.lock_dir({}).name == f"ddmd-{os.getuid()}"
    assert instance.lock_dir({"XDG_RUNTIME_DIR": "relative/dir"}).name == f"ddmd-{os.getuid()}"
    assert instance.lock_dir({"XDG_RUNTIME_DIR": "/run/user/5"}) == Path("/run/user/5/ddmd")


def test_an_unsafe_lock_dir_is_not_used(tmp_path):
    runtime = tmp_path / "run"
    (runtime / "ddmd").mkdir(parents=True)
    (runtime / "ddmd").chmod(0o777)  # others could swap the lock file
    with instance.claim(config_for(9815), {"XDG_RUNTIME_DIR": str(runtime)}, check=nobody) as c:
        assert c.lock is None
        assert c.problem is not None
        assert "writable by others" in c.problem
    assert not (runtime / "ddmd" / "control-9815.lock").exists()


# ------------------------------------------------------------------------------ probe


class _Answer(BaseHTTPRequestHandler):
    status = 200
    body = b""
    headers_out: dict[str, str] = {}
    seen: list[tuple[str, str | None]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        self.send_response(self.status)
        for name, value in self.headers_out.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet


@pytest.fixture
def server() -> Iterator[tuple[type[_Answer], int]]:
    class Handler(_Answer):
        seen: list[tuple[str, str | None]] = []

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield Handler, httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def test_probe_recognises_ddmds_health_answer(server):
    handler, port = server
    handler.body = json.dumps({"status": "ok", "version": "0.1.0", "vms": 2, "pid": 55}).encode()
    assert instance.probe("127.0.0.1", port, "tok") == Running(pid=55)
    assert handler.seen == [("/api/v1/health", "Bearer tok")]
    handler.body = json.dumps({"status": "ok", "version": "0.0.9", "vms": 0}).encode()
    assert instance.probe("0.0.0.0", port) == Running(pid=None)  # older daemon, no pid


@pytest.mark.parametrize(
    ("status", "body", "headers", "expected"),
    [
        (401, b'{"error": "wrong token"}', {"WWW-Authenticate": 'Bearer realm="ddmd"'}, True),
        (401, b"", {"WWW-Authenticate": 'Basic realm="router"'}, False),
        (200, b'{"status": "ok"}', {}, False),  # no version: not ddmd
        (200, b"<html>hello</html>", {}, False),
        (404, b"", {}, False),
    ],
)
def test_probe_tells_other_programs_apart(server, status, body, headers, expected):
    handler, port = server
    handler.status, handler.body, handler.headers_out = status, body, headers
    assert (instance.probe("127.0.0.1", port) is not None) is expected


def test_probe_of_a_closed_port_or_a_silent_listener_is_none():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert instance.probe("127.0.0.1", port) is None
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        # Accepted by the kernel, never answered: the timeout ends the wait.
        assert instance.probe("127.0.0.1", silent.getsockname()[1], timeout=0.2) is None
