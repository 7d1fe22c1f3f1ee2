"""A monitoring lab with real peers: a real Prometheus server scraping several ddmd daemons.

    async with (
        start_daemon(tmp_path, "lab-a", debugger_ports, current_port, scan=ports) as a,
        prometheus(tmp_path, [a.target]) as prom,
    ):
        await prom.wait_for('up{job="ddmd"} == 1', lambda rows: len(rows) == 1, "a up", 20)
        rows = await prom.query('ddmd_info{host="lab-a"}')

Each daemon runs as users run it: ``python -m ddmd run --config FILE --log-format json``, a
process of its own with a config file in a directory of its own (``[metrics] host``, its scan
range, adb on or off, ``[logcat] keep``), ``HOME`` there too, no unix control socket and no adb
front. Its output is read line by line (`Daemon.events` parses the JSON log lines).

Prometheus is Debian's ``/usr/bin/prometheus`` (2.x) on a free loopback port with a storage
directory under the test's tmp_path and a config of one job, ``ddmd``, with ``honor_labels:
true``, scraping every target's ``/metrics`` every second (``evaluation_interval`` 1 s too).
`Prometheus.query` runs an instant query through ``/api/v1/query``; `Prometheus.wait_for`
polls one until a predicate holds, with a deadline that fails with the query and what it last
returned.

Everything is stopped at exit, also on failure: SIGTERM, then SIGKILL after a grace period.
A missing program skips the test outside CI and fails it under ``CI=true``
(`tests.actors.needs`): CI installs Debian's ``prometheus`` package (prometheus and promtool).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.actors.needs import skip_or_fail
from tests.actors.rawpeers import free_port

__all__ = [
    "Daemon",
    "Prometheus",
    "prometheus",
    "promtool_check_metrics",
    "require_program",
    "start_daemon",
]

START_TIMEOUT = 30.0  # seconds: a daemon or Prometheus answering HTTP, on a busy machine
STOP_GRACE = 10.0  # seconds: SIGTERM to exit, before SIGKILL
HTTP_TIMEOUT = 5.0  # seconds: one HTTP request
TOOL_TIMEOUT = 20.0  # seconds: one promtool run
POLL_STEP = 0.2  # seconds between two polls
_DROPPED_ENV = (
    "DDMD_CONFIG",
    "XDG_CONFIG_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
    "ANDROID_ADB_SERVER_PORT",
    "ANDROID_ADB_SERVER_ADDRESS",
    "ADB_SERVER_SOCKET",
)


def require_program(name: str, package: str) -> str:
    """The path of ``name``; skips the test (outside CI) or fails it (``CI=true``) without it."""
    path = shutil.which(name)
    if path is None:
        skip_or_fail(f"the {name!r} program is not installed (Debian: apt install {package})")
    assert path is not None
    return path


# --------------------------------------------------------------------------------------------
# Processes


@dataclass
class _Child:
    """A child process whose merged stdout and stderr is kept line by line."""

    name: str
    process: trio.Process
    lines: list[str] = field(default_factory=list)

    async def read_output(self) -> None:
        assert self.process.stdout is not None
        pending = b""
        async for data in self.process.stdout:
            pending += data
            *whole, pending = pending.split(b"\n")
            self.lines.extend(line.decode("utf-8", "replace") for line in whole)
        if pending:
            self.lines.append(pending.decode("utf-8", "replace"))

    def tail(self, count: int = 30) -> str:
        return "\n".join(self.lines[-count:])

    def exited(self) -> bool:
        return self.process.poll() is not None

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL when it has not exited after `STOP_GRACE` seconds."""
        with trio.CancelScope(shield=True):
            if self.process.returncode is None:
                self.process.send_signal(signal.SIGTERM)
                with trio.move_on_after(STOP_GRACE):
                    await self.process.wait()
            if self.process.returncode is None:
                self.process.kill()
                with trio.move_on_after(STOP_GRACE):
                    await self.process.wait()


@asynccontextmanager
async def _child(
    name: str, args: Sequence[str], *, cwd: Path, env: dict[str, str]
) -> AsyncIterator[_Child]:
    """Run ``args``; its output is read in the background; it is stopped at exit."""
    process = await trio.lowlevel.open_process(
        list(args),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=env,
    )
    child = _Child(name, process)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(child.read_output)
            try:
                yield child
            finally:
                await child.stop()
    finally:
        await child.stop()  # when the nursery itself failed to open or to close


async def _wait_http(child: _Child, url: str, what: str) -> None:
    """Poll ``url`` until it answers 200; fail early (with the output) when the child exits."""
    last = "no answer yet"
    async with httpx.AsyncClient(trust_env=False, timeout=HTTP_TIMEOUT) as client:
        with trio.move_on_after(START_TIMEOUT):
            while not child.exited():
                try:
                    response = await client.get(url)
                except httpx.HTTPError as err:
                    last = repr(err)
                else:
                    if response.status_code == 200:
                        return
                    last = f"HTTP {response.status_code}"
                await trio.sleep(POLL_STEP)
    state = "exited" if child.exited() else f"not ready within {START_TIMEOUT:g} s"
    raise AssertionError(f"{what} {state} (last: {last}); its output:\n{child.tail()}")


# --------------------------------------------------------------------------------------------
# ddmd daemons


@dataclass
class Daemon:
    """A running ``ddmd run``: its ``[metrics] host`` label, control port and output."""

    host: str
    control_port: int
    child: _Child

    @property
    def target(self) -> str:
        """Its scrape target (the control API's address: ``/metrics`` is there)."""
        return f"127.0.0.1:{self.control_port}"

    @property
    def url(self) -> str:
        return f"http://{self.target}"

    def events(self, name: str, **match: object) -> list[dict[str, Any]]:
        """Its JSON log lines whose ``event`` is ``name`` and whose fields equal ``match``."""
        found = []
        for line in self.child.lines:
            if not line.startswith("{"):
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("event") == name and all(entry.get(k) == v for k, v in match.items()):
                found.append(entry)
        return found

    def output(self) -> str:
        return self.child.tail()


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string is a JSON string for these values


def daemon_config(
    workdir: Path,
    host: str,
    control_port: int,
    debugger_ports: Sequence[int],
    current_port: int,
    *,
    scan: Sequence[int] = (),
    adb_port: int | None = None,
    adb_path: str = "adb",
) -> str:
    """The TOML text of one lab daemon's config (quick scans and timeouts, no front)."""
    sections: dict[str, dict[str, object]] = {
        "metrics": {"host": host},
        "scan": (
            {"enabled": True, "ports": f"{scan[0]}-{scan[-1]}", "interval": 0.2, "backoff_max": 1.0}
            if scan
            else {"enabled": False}
        ),
        "adb": (
            {"enabled": "on", "port": adb_port, "path": adb_path}
            if adb_port is not None
            else {"enabled": "off"}
        ),
        "front": {"enabled": False},
        "logcat": {"keep": True},
        "control": {"port": control_port, "socket": ""},
        "debugger": {
            "ports": f"{debugger_ports[0]}-{debugger_ports[-1]}",
            "current_port": current_port,
            "state_file": str(workdir / "ports.json"),
        },
        "timeouts": {"ddm_request": 1.0, "connect": 1.0, "handshake": 1.0, "shutdown_grace": 2.0},
    }
    out = []
    for name, values in sections.items():
        out.append(f"[{name}]")
        out.extend(f"{key} = {_toml(value)}" for key, value in values.items())
        out.append("")
    return "\n".join(out)


@asynccontextmanager
async def start_daemon(
    tmp_path: Path,
    host: str,
    debugger_ports: Sequence[int],
    current_port: int,
    *,
    scan: Sequence[int] = (),
    adb_port: int | None = None,
    adb_path: str = "adb",
) -> AsyncIterator[Daemon]:
    """``python -m ddmd run`` with its own config (see `daemon_config`); yields once its
    control API answers; stops it (SIGTERM) at exit."""
    workdir = tmp_path / host
    (workdir / "home").mkdir(parents=True)
    control_port = free_port()
    config = workdir / "ddmd.toml"
    config.write_text(
        daemon_config(
            workdir,
            host,
            control_port,
            debugger_ports,
            current_port,
            scan=scan,
            adb_port=adb_port,
            adb_path=adb_path,
        )
    )
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
    env.update(HOME=str(workdir / "home"), PYTHONUNBUFFERED="1")
    args = [sys.executable, "-m", "ddmd", "run", "--config", str(config), "--log-format", "json"]
    async with _child(f"ddmd {host}", args, cwd=workdir, env=env) as child:
        daemon = Daemon(host, control_port, child)
        await _wait_http(child, f"{daemon.url}/api/v1/vms", f"ddmd {host}")
        yield daemon


# --------------------------------------------------------------------------------------------
# Prometheus


def prometheus_config(targets: Sequence[str]) -> str:
    """One job, ``ddmd``: every target's /metrics every second, the labels ddmd exports kept."""
    listed = ", ".join(f'"{t}"' for t in targets)
    return f"""\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: ddmd
    honor_labels: true
    metrics_path: /metrics
    static_configs:
      - targets: [{listed}]
"""


Rows = list[dict[str, Any]]


@dataclass
class Prometheus:
    """A running Prometheus server and an HTTP client on its API."""

    port: int
    child: _Child
    client: httpx.AsyncClient

    async def query(self, expr: str) -> Rows:
        """An instant query's result (now): a list of ``{"metric": {...}, "value": [t, v]}``."""
        response = await self.client.get("/api/v1/query", params={"query": expr})
        body = response.json()
        failed = f"query {expr!r} failed: HTTP {response.status_code} {body}"
        assert response.status_code == 200, failed
        assert body.get("status") == "success", failed
        assert body["data"]["resultType"] == "vector", body
        rows: Rows = body["data"]["result"]
        return rows

    async def wait_for(
        self,
        expr: str,
        holds: Callable[[Rows], bool],
        what: str,
        timeout: float,  # noqa: ASYNC109 - the deadline of this one wait
    ) -> Rows:
        """Poll ``expr`` until ``holds(rows)``; on the deadline fail with ``what`` and the
        last rows."""
        rows: Rows = []
        with trio.move_on_after(timeout):
            while True:
                rows = await self.query(expr)
                if holds(rows):
                    return rows
                await trio.sleep(POLL_STEP)
        raise AssertionError(
            f"not within {timeout:g} s: {what}\n  query: {expr}\n  last result: {rows}"
        )

    async def targets(self) -> Rows:
        """The active scrape targets as Prometheus reports them (health, lastError)."""
        response = await self.client.get("/api/v1/targets")
        active: Rows = response.json()["data"]["activeTargets"]
        return active


@asynccontextmanager
async def prometheus(
    tmp_path: Path, targets: Sequence[str], *, program: str = "prometheus"
) -> AsyncIterator[Prometheus]:
    """Prometheus on a free loopback port scraping ``targets``; yields once it is ready."""
    workdir = tmp_path / "prometheus"
    (workdir / "data").mkdir(parents=True)
    config = workdir / "prometheus.yml"
    config.write_text(prometheus_config(targets))
    port = free_port()
    args = [
        program,
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    env = {**os.environ, "HOME": str(workdir)}
    async with _child("prometheus", args, cwd=workdir, env=env) as child:
        await _wait_http(child, f"http://127.0.0.1:{port}/-/ready", "prometheus")
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=HTTP_TIMEOUT
        ) as client:
            yield Prometheus(port, child, client)


async def promtool_check_metrics(promtool: str, text: str) -> subprocess.CompletedProcess[bytes]:
    """``promtool check metrics`` with ``text`` on its stdin (its exit code is not checked)."""
    with trio.fail_after(TOOL_TIMEOUT):
        return await trio.run_process(
            [promtool, "check", "metrics"],
            stdin=text.encode(),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


def now() -> float:
    """Wall-clock seconds, the clock of Prometheus's sample timestamps."""
    return time.time()
