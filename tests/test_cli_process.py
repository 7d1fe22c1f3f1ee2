"""The `ddmd` CLI as a process (issue 31, item 5): Ctrl-C ends `ddmd run` and `ddmd demo` with
130 (SIGTERM with 0), and a reader that went away (``ddmd ... | head``) ends every command with
0 and no message.

Each command runs as a user runs it (``python -m ddmd ...``), with a private config on free
ports. A closed pipe: the command's stdout is the write end of a pipe whose read end is closed
before the command starts, so its first line meets EPIPE. The client commands ask a ``ddmd
demo`` (its three simulated VMs); ``logcat``, which needs a device, runs in a small driver
process whose daemon is `test_cli_logcat`'s fake (the CLI's transport seam). Every wait is
bounded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.actors.test_demo_run import HINTS_END, STARTUP, Demo, demo
from tests.test_service import _daemon_config, _daemon_env, _health, _start

ROOT = Path(__file__).resolve().parent.parent
MAIL = "com.example.mail"
RUN_TIMEOUT = 60  # seconds for one CLI command


# ------------------------------------------------------------------------------ Ctrl-C


def _log_events(path: Path) -> list[str]:
    lines = path.read_text().splitlines()
    return [str(json.loads(text).get("event")) for text in lines if text.startswith("{")]


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_ctrl_c_ends_ddmd_run_with_130_after_a_graceful_stop(tmp_path, signum, code):
    config, control, _ = _daemon_config(tmp_path)
    proc = _start(tmp_path, config, _daemon_env(tmp_path), "run")
    try:
        _health(control, proc, tmp_path, "run")
        proc.send_signal(signum)
        assert proc.wait(timeout=20) == code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    events = _log_events(tmp_path / "run.out")
    # The daemon's own shutdown ran: the signal was seen, then it stopped.
    assert events.index("daemon.signal_received") < events.index("daemon.stopped")
    assert "Traceback" not in (tmp_path / "run.err").read_text()


def test_ctrl_c_ends_ddmd_demo_with_130(tmp_path):
    with demo(tmp_path) as running:
        running.wait_for(HINTS_END, STARTUP)
        lines = running.stop()  # SIGINT
    assert running.proc.returncode == 130, lines
    assert not [text for text in lines if "Traceback" in text]


# ------------------------------------------------------------------------------ closed pipe


def closed_pipe_run(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``argv`` with stdout a pipe nobody reads any more: its exit code and stderr."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            argv,
            stdout=write,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            env=env,
            timeout=RUN_TIMEOUT,
        )
    finally:
        os.close(write)
    return done.returncode, done.stderr.decode(errors="replace")


@pytest.fixture(scope="module")
def running_demo(tmp_path_factory) -> Iterator[tuple[Demo, Path]]:
    tmp = tmp_path_factory.mktemp("demo")
    with demo(tmp) as running:
        running.wait_for(HINTS_END, STARTUP)
        yield running, tmp / "demo.toml"


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["clients"],
        ["clients", "--json"],
        ["devices"],
        ["threads", MAIL],
        ["threads", MAIL, "--watch", "--interval", "0.1"],
        ["threads", MAIL, "--watch", "--json", "--interval", "0.1"],
        ["heap", MAIL],
        ["stack", MAIL],
        ["attach", MAIL],
        ["ports"],
        ["events"],
        ["events", "--json"],
        ["threads", "--help"],
    ],
    ids=" ".join,
)
def test_a_closed_stdout_ends_every_command_with_0_and_no_message(running_demo, args):
    _, config = running_demo
    code, stderr = closed_pipe_run(
        [
            sys.executable,
            "-m",
            "ddmd",
            *args,
            *([] if "--help" in args else ["--config", str(config)]),
        ]
    )
    assert (code, stderr) == (0, "")


def test_a_closed_stdout_ends_check_config_with_0(tmp_path):
    code, stderr = closed_pipe_run(
        [sys.executable, "-m", "ddmd", "check-config", str(ROOT / "config.example.toml")]
    )
    assert (code, stderr) == (0, "")


#: A driver process: `ddmd logcat ARGS` against test_cli_logcat's fake daemon (many lines).
LOGCAT_DRIVER = """
import sys
import httpx
from ddmd.cli import client
from ddmd.cli.main import main
from tests.control.test_cli_logcat import FakeDaemon, line, sse

fake = FakeDaemon()
fake.recent = [line(seq) for seq in range(1, 200)]
fake.streams = [sse([line(seq) for seq in range(1, 200)])]
client.make_transport = lambda: httpx.MockTransport(fake.handle)
main(sys.argv[1:], prog_name="ddmd")
"""


@pytest.mark.parametrize(
    "args",
    [
        ["logcat", "-d", MAIL],
        ["logcat", "-d", MAIL, "--json"],
        ["logcat", MAIL],
        ["logcat", MAIL, "--json"],
    ],
    ids=" ".join,
)
def test_a_closed_stdout_ends_logcat_with_0_and_no_message(tmp_path, args):
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    env.pop("DDMD_CONFIG", None)
    code, stderr = closed_pipe_run([sys.executable, "-c", LOGCAT_DRIVER, *args], env)
    assert (code, stderr) == (0, "")
