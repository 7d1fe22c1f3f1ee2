"""ddmd as the benches run it: its config file, the daemon's start and stop, its control API
(waiting for VMs), its JSON log, and which ddmd code runs (the working tree, or a
``git archive`` snapshot of a revision).

Every bench starts ddmd the same way (``ddmd_argv``): ``python -P -m ddmd`` with this
interpreter, so the current directory is never searched first and a snapshot put on
PYTHONPATH (``use_tree``) is what runs, not the working tree.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from . import HOST, ROOT
from .children import Child, Children
from .ports import Layout, Ports, spec

T = TypeVar("T")
Vm = dict[str, Any]
Sections = Mapping[str, Mapping[str, object]]


def ddmd_argv(*args: str, python: Sequence[str] = ()) -> list[str]:
    """``python -P [python...] -m ddmd ARGS``; ``python`` goes before ``-m ddmd`` (e.g.
    ``-m cProfile -o FILE``)."""
    return [sys.executable, "-P", *python, "-m", "ddmd", *args]


def toml(sections: Sections) -> str:
    """A ddmd config file: a table per section; strings quoted, booleans lower case."""
    out = []
    for name, values in sections.items():
        out.append(f"[{name}]")
        for key, value in values.items():
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, str | Path):
                text = f'"{value}"'
            else:
                text = str(value)
            out.append(f"{key} = {text}")
        out.append("")
    return "\n".join(out)


def write_config(path: Path, sections: Sections) -> Path:
    path.write_text(toml(sections), encoding="utf-8")
    return path


def json_log() -> dict[str, object]:
    """The [log] section every bench uses: ddmd's events as JSON lines, level info."""
    return {"format": "json", "level": "info"}


def scan_config(
    ports: Layout, state_file: Path, interval: float, backoff_max: float = 60.0
) -> dict[str, dict[str, object]]:
    """A config scanning ``ports.scan`` every ``interval`` s, adb off, everything on
    127.0.0.1, a JSON log; add sections or settings to it."""
    scan = {"host": HOST, "ports": spec(ports.scan), "interval": interval}
    return {
        "scan": {**scan, "backoff_max": backoff_max},
        "adb": {"enabled": "off"},
        "debugger": {
            "host": HOST,
            "ports": spec(ports.debugger),
            "current_port": ports.current,
            "state_file": state_file,
        },
        "control": {"host": HOST, "port": ports.control},
        "log": json_log(),
    }


@dataclass
class Daemon:
    """One ``ddmd run`` process, its JSON log (its stdout) and its control port."""

    child: Child
    log_path: Path
    log_file: IO[str] | None
    control_port: int

    @property
    def base(self) -> str:
        return f"http://{HOST}:{self.control_port}"

    def stop(self, children: Children | None = None) -> None:
        if children is not None:
            children.stop(self.child)
        else:
            self.child.stop()
        if self.log_file is not None:
            self.log_file.close()

    def events(self, event: str) -> list[dict[str, object]]:
        """Every record of ``event`` in the JSON log."""
        return log_events(self.log_path, event)

    def tail(self, lines: int = 12) -> str:
        """The end of the log, for an error message."""
        text = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
        return "\nddmd's log ends:\n" + "\n".join(line[:300] for line in text)

    def wait_vms(
        self,
        good: Callable[[list[Vm]], T | None],
        what: str,
        *,
        timeout: float = 30.0,
        interval: float = 0.1,
        alive: Callable[[], None] | None = None,
    ) -> T:
        """Poll ``GET /api/v1/vms`` until ``good(vms)`` is not None, and return it."""

        def check() -> None:
            self.child.check_alive()
            if alive is not None:
                alive()

        return wait_vms(self.control_port, good, what, check, timeout=timeout, interval=interval)

    def wait_vm(
        self,
        vm_id: str,
        good: Callable[[Vm], bool],
        *,
        timeout: float = 30.0,
        interval: float = 0.1,
    ) -> Vm:
        """The control API's entry of ``vm_id`` once ``good`` says so."""

        def find(vms: list[Vm]) -> Vm | None:
            return next((dict(v) for v in vms if v["id"] == vm_id and good(v)), None)

        return self.wait_vms(find, f"{vm_id} not as expected", timeout=timeout, interval=interval)

    def select(self, vm_id: str) -> None:
        import httpx

        with httpx.Client(base_url=self.base, timeout=5.0, trust_env=False) as api:
            api.post(f"/api/v1/vms/{vm_id}/select").raise_for_status()


def start_ddmd(
    config: Path,
    log_path: Path,
    control_port: int,
    *,
    children: Children | None = None,
    name: str = "ddmd",
    python: Sequence[str] = (),
    json_flag: bool = True,
) -> Daemon:
    """``ddmd run --config CONFIG [--log-format json]``, its stdout (the log) into
    ``log_path``; in ``children`` when given."""
    log_file = log_path.open("w", encoding="utf-8")
    argv = ddmd_argv("run", "--config", str(config), python=python)
    if json_flag:
        argv += ["--log-format", "json"]
    try:
        if children is not None:
            child = children.start(name, argv, stdout=log_file)
        else:
            child = Child(name, argv, stdout=log_file)
    except BaseException:
        log_file.close()
        raise
    return Daemon(child, log_path, log_file, control_port)


def wait_vms(
    control_port: int,
    good: Callable[[list[Vm]], T | None],
    what: str,
    alive: Callable[[], None],
    *,
    timeout: float = 30.0,
    interval: float = 0.1,
) -> T:
    """Poll ddmd's ``GET /api/v1/vms`` every ``interval`` s until ``good(vms)`` is not None;
    ``alive()`` raises when a process it needs is gone."""
    import httpx

    deadline = time.monotonic() + timeout
    with httpx.Client(
        base_url=f"http://{HOST}:{control_port}", timeout=10.0, trust_env=False
    ) as api:
        while True:
            alive()
            found = None
            with contextlib.suppress(httpx.HTTPError, ValueError):
                found = good(api.get("/api/v1/vms").json())
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"ddmd: {what} within {timeout:g} s")
            time.sleep(interval)


def log_events(log_path: Path, event: str) -> list[dict[str, object]]:
    """Every record of ``event`` in a ddmd JSON log."""
    found = []
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if f'"{event}"' in line:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("event") == event:
                    found.append(record)
    return found


def log_problems(
    log_path: Path, levels: Sequence[str] = ("warning", "error", "critical")
) -> dict[str, int]:
    """How many records of each event a ddmd JSON log has at ``levels``."""
    out: dict[str, int] = {}
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if record.get("level") in levels:
                event = str(record.get("event", "?"))
                out[event] = out.get(event, 0) + 1
    return out


# --------------------------------------------------------------------------------------------
# ddmd scanning one port (bridge_latency, multi_debugger)


def plain_ready(vm: Vm) -> bool:
    """A plain JVM (no DDM) identified, with its own debugger port."""
    return vm["state"] == "ready" and vm["ddm"] is False and bool(vm.get("debugger_port"))


@dataclass
class Scanning:
    """``ddmd run`` scanning one port: its current-VM port, and the VM's own debugger port;
    with adb, the VM found through adb and its debugger port too."""

    daemon: Daemon
    current_port: int
    vm_id: str
    vm_port: int = 0
    adb_vm_id: str | None = None
    adb_port: int | None = None

    @property
    def child(self) -> Child:
        return self.daemon.child

    @property
    def log_path(self) -> Path:
        return self.daemon.log_path

    @property
    def control_port(self) -> int:
        return self.daemon.control_port


def start_scanning(
    children: Children,
    work: Path,
    name: str,
    scan_port: int,
    ports: Ports,
    *,
    debugger: Mapping[str, object] | None = None,
    adb: tuple[int, str, int] | None = None,
) -> Scanning:
    """``ddmd run`` scanning only ``scan_port`` every 0.5 s; ``debugger``: more [debugger]
    settings. With ``adb`` (server port, serial, pid), ddmd uses that adb server (and never
    starts one: the adb program configured does not exist) and holds the pid behind it. Returns
    once the scanned VM is identified and selected (and the one behind adb ready)."""
    control_port, current_port = ports.take(), ports.take()
    first, last = ports.take_range(2)  # a per-VM port for the scanned VM and the adb one
    config = work / f"{name}.toml"
    layout = Layout(
        range(scan_port, scan_port + 1), range(first, last + 1), current_port, control_port
    )
    sections = scan_config(layout, work / f"{name}-ports.json", 0.5)
    sections["debugger"].update(debugger or {})
    if adb is not None:
        no_adb = work / "no-adb-program"
        sections["adb"] = {"enabled": "on", "host": HOST, "port": adb[0], "path": no_adb}
    write_config(config, sections)
    daemon = start_ddmd(config, work / f"{name}.log", control_port, children=children, name=name)
    ddmd = Scanning(daemon, current_port, f"tcp:{scan_port}")
    try:
        vm = daemon.wait_vm(ddmd.vm_id, plain_ready)
        ddmd.vm_port = int(str(vm["debugger_port"]))
        daemon.select(ddmd.vm_id)
        if adb is not None:
            ddmd.adb_vm_id = f"{adb[1]}/{adb[2]}"
            found = daemon.wait_vm(ddmd.adb_vm_id, plain_ready)
            ddmd.adb_port = int(str(found["debugger_port"]))
    except BaseException:
        daemon.stop(children)
        raise
    return ddmd


# --------------------------------------------------------------------------------------------
# Which code runs


def git(*args: str, strip: bool = True) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return done.stdout.strip() if strip else done.stdout


def changed_files() -> list[str]:
    """The files under ddmd/ that differ from HEAD (tracked ones)."""
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "ddmd", strip=False)
    return [line[3:] for line in dirty.splitlines()]


def code_under_test(ref: str | None, work: Path, program: str) -> tuple[str, Path | None]:
    """Which ddmd code runs: the working tree, or (with ``ref``) a ``git archive`` snapshot
    of that revision extracted under ``work`` (returned; put it first on PYTHONPATH)."""
    if ref is None:
        changed = len(changed_files())
        return f"the working tree at {git('rev-parse', '--short', 'HEAD')}" + (
            f" + {changed} changed file(s) under ddmd/" if changed else ""
        ), None
    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
    if not commit:
        raise SystemExit(f"{program}: --ref {ref}: not a revision of {ROOT}")
    tree = work / "tree"
    tree.mkdir()
    archive = subprocess.Popen(
        ["git", "-C", str(ROOT), "archive", commit, "ddmd"], stdout=subprocess.PIPE
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], stdin=archive.stdout, check=True)
    if archive.wait():
        raise SystemExit(f"{program}: git archive {commit} failed")
    return f"a snapshot of {ref} = {commit[:7]}", tree


def use_tree(ref: str | None, work: Path, program: str, *, here: bool = False) -> str:
    """With ``ref``, ddmd runs from a ``git archive`` snapshot of that revision, not from the
    working tree, which others may be editing meanwhile: the children through PYTHONPATH
    (before the editable install's finder; they run with -P, so the current directory is not
    searched first), and with ``here`` this process too (first on sys.path, before anything of
    ddmd is imported). Says which code runs."""
    said, snapshot = code_under_test(ref, work, program)
    if snapshot is not None:
        os.environ["PYTHONPATH"] = str(snapshot)
        if here:
            sys.path.insert(0, str(snapshot))
    return said
