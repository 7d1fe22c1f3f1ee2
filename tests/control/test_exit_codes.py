"""The one exit-code table (issue 20, part 2, item 7), command by command and situation by
situation, against the real control API over fake VMs (`profvm.Daemon`):

    0  done (also an empty list, an unconfirmed GC, Ctrl-C ending --watch/events/logcat)
    1  the VM or the daemon refused, or the feature is not available for this VM (threads and
       heap too); a file that cannot be read or written
    2  usage; an unknown or ambiguous TARGET/THREAD/APP/--device; no TARGET and no current VM;
       a bad config file
    3  no daemon answers at the control address
    4  run/demo: a ddmd already runs there (tests/test_instance.py)

The same table is in `cli.client`'s docstring and docs/cli.md's "Exit codes". A command that
has no such situation has no row for it (`hprof-summary` asks no daemon; `ports` reads the
state file itself when no daemon answers, so that is its 0).
"""

from __future__ import annotations

import json
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from starlette.responses import Response
from starlette.routing import Route

from ddmd.cli import client as cli_client
from ddmd.cli.client import EXIT_API_ERROR, EXIT_NO_DAEMON, EXIT_OK, EXIT_TARGET
from ddmd.cli.main import main
from ddmd.config import PortRange
from ddmd.control.events import make_event
from ddmd.drive.ports import VmPorts
from ddmd.errors import DdmFailed, VmGone
from ddmd.portbook import PortBook
from ddmd.protocol.sse import event_frame
from ddmd.registry import VmRegistry
from ddmd.sim.hprof import dump_bytes, sim_heap_content
from ddmd.sim.trace import build_trace, default_recording

from .fakes import FEATURES, make_registry
from .profvm import Daemon, ProfVm

OK, REFUSED, USAGE, NO_DAEMON = EXIT_OK, EXIT_API_ERROR, EXIT_TARGET, EXIT_NO_DAEMON
assert (OK, REFUSED, USAGE, NO_DAEMON) == (0, 1, 2, 3)  # the table's numbers

MAIL = "com.example.mail"
MAPS = "com.example.maps:remote"
GONE = "no answer within 5 s; newer Android versions removed the {} handlers"


def world() -> VmRegistry:
    """mail: every feature; maps: Android 12+ (no thread, heap or allocation handlers, no heap
    dumps); the plain JVM tcp:8000 (no DDM: no GC, stacks, tracing, allocations, kill)."""
    mail = ProfVm.android("emulator-5554/3101", app=MAIL, package=MAIL, debugger_port=8600)
    maps = ProfVm.android(
        "emulator-5554/3103",
        app=MAPS,
        package="com.example.maps",
        threads=None,
        heaps=(),
        debugger_port=8601,
        unsupported=("THST", "STKL", "HPIF", "HPSG", "REAQ", "HPDS"),
        unsupported_reasons=(("THST", GONE.format("thread")), ("HPIF", GONE.format("heap"))),
    )
    maps.unsupported = frozenset({"threads", "stack", "heap_segments", "allocs", "hprof"})
    jvm = ProfVm.plain_jvm("tcp:8000", debugger_port=None)
    jvm.unsupported = frozenset({*FEATURES, "trace", "allocs", "kill"})
    registry = make_registry(mail, maps, jvm)
    registry.set_device("emulator-5554", "device")
    return registry


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def canned_events(ending: str | None) -> Route:
    """An event stream that sends stream.opened and then `ending` (None: it just closes)."""
    events = [make_event("stream.opened", current=None, vms=[])]
    if ending is not None:
        events.append(make_event(ending))
    body = b"".join(event_frame(e) for e in events)

    async def endpoint(request: Any) -> Response:
        return Response(body, media_type="text/event-stream")

    return Route("/api/v1/events", endpoint)


@dataclass(frozen=True)
class Case:
    """`ddmd ARGS` in a situation, and the exit code the table gives it."""

    args: tuple[str, ...]
    situation: str
    code: int

    @property
    def id(self) -> str:
        return f"{' '.join(self.args)} [{self.situation}] -> {self.code}"


#: Situations: "current" (mail is the current VM), "none" (VMs, none current), "down" (no
#: daemon: --control to a closed port), "token" (the daemon wants a token the CLI lacks),
#: "events ok"/"events cut" (the event stream ends with daemon.stopping / just closes),
#: "file" (no daemon involved).
def c(args: str, situation: str, code: int) -> Case:
    return Case(tuple(args.split()), situation, code)


CASES = [
    # clients, devices, extensions
    c("clients", "none", OK),
    c("clients --bogus", "none", USAGE),
    c("clients", "token", REFUSED),
    c("clients", "down", NO_DAEMON),
    c("devices", "none", OK),
    c("devices --bogus", "none", USAGE),
    c("devices", "down", NO_DAEMON),
    c("extensions", "none", OK),
    c("extensions", "down", NO_DAEMON),
    # threads
    c("threads mail", "none", OK),
    c("threads", "current", OK),
    c("threads maps", "none", REFUSED),  # not available: Android 12
    c("threads maps --json", "none", REFUSED),  # whatever the output
    c("threads gone", "none", REFUSED),  # the VM went away meanwhile
    c("threads nosuch", "none", USAGE),
    c("threads mail --device nosuch", "none", USAGE),
    c("threads", "none", USAGE),
    c("threads mail", "down", NO_DAEMON),
    # heap
    c("heap mail", "none", OK),
    c("heap", "current", OK),
    c("heap maps", "none", REFUSED),
    c("heap maps --segments", "none", REFUSED),
    c("heap nosuch", "none", USAGE),
    c("heap", "none", USAGE),
    c("heap mail", "down", NO_DAEMON),
    # gc
    c("gc mail", "none", OK),
    c("gc", "current", OK),
    c("gc 4242", "none", REFUSED),  # a plain JVM: no GC over DDM
    c("gc refuses", "none", REFUSED),  # the VM answered FAIL
    c("gc nosuch", "none", USAGE),
    c("gc", "none", USAGE),
    c("gc mail", "down", NO_DAEMON),
    # select
    c("select mail", "none", OK),
    c("select 8000", "none", OK),  # a scan port
    c("select nosuch", "none", USAGE),
    c("select", "none", USAGE),
    c("select mail", "down", NO_DAEMON),
    # stack
    c("stack mail main", "none", OK),
    c("stack main", "current", OK),
    c("stack maps main", "none", REFUSED),
    c("stack maps 1", "none", REFUSED),
    c("stack 4242 1", "none", REFUSED),
    c("stack mail nosuch", "none", USAGE),
    c("stack nosuch 1", "none", USAGE),
    c("stack main", "none", USAGE),
    c("stack a b c", "none", USAGE),
    c("stack mail main", "down", NO_DAEMON),
    # attach
    c("attach mail", "none", OK),
    c("attach", "current", OK),
    c("attach 4242", "none", REFUSED),  # no debugger port of its own, and not current
    c("attach nosuch", "none", USAGE),
    c("attach", "none", USAGE),
    c("attach mail", "down", NO_DAEMON),
    # trace
    c("trace mail --seconds 0.01", "none", OK),
    c("trace --seconds 0.01", "current", OK),
    c("trace 4242 --seconds 0.01", "none", REFUSED),
    c("trace nosuch --seconds 0.01", "none", USAGE),
    c("trace --seconds 0.01", "none", USAGE),
    c("trace mail --seconds 0.01 -o nodir/x.trace", "none", USAGE),
    c("trace mail --seconds 0.01", "down", NO_DAEMON),
    # allocs
    c("allocs mail", "none", OK),
    c("allocs --status", "current", OK),
    c("allocs maps --status", "none", REFUSED),  # not available, though it is an answer
    c("allocs maps --start", "none", REFUSED),
    c("allocs nosuch", "none", USAGE),
    c("allocs", "none", USAGE),
    c("allocs mail --start --stop", "none", USAGE),
    c("allocs mail", "down", NO_DAEMON),
    # hprof
    c("hprof mail", "none", OK),
    c("hprof", "current", OK),
    c("hprof maps", "none", REFUSED),
    c("hprof nosuch", "none", USAGE),
    c("hprof", "none", USAGE),
    c("hprof mail -o nodir/x.hprof", "none", USAGE),
    c("hprof mail", "down", NO_DAEMON),
    # kill
    c("kill mail --yes", "none", OK),
    c("kill --yes", "current", OK),
    c("kill 4242 --yes", "none", REFUSED),
    c("kill mail", "none", USAGE),  # no terminal to ask on, no --yes
    c("kill nosuch --yes", "none", USAGE),
    c("kill --yes", "none", USAGE),
    c("kill mail --yes", "down", NO_DAEMON),
    # logcat
    c("logcat 4242 --no-follow", "none", REFUSED),  # a workstation JVM has no logcat
    c("logcat nosuch --no-follow", "none", USAGE),
    c("logcat --no-follow", "none", USAGE),
    c("logcat mail --no-follow", "down", NO_DAEMON),
    # ports
    c("ports", "none", OK),
    c("ports --forget nosuch", "none", USAGE),
    c("ports", "down", OK),  # reads the state file itself
    # events
    c("events", "events ok", OK),
    c("events", "events cut", REFUSED),
    c("events --bogus", "events ok", USAGE),
    c("events", "down", NO_DAEMON),
    # files: no daemon
    c("hprof-summary dump.hprof", "file", OK),
    c("hprof-summary nothing.hprof", "file", REFUSED),
    c("hprof-summary garbage.bin", "file", REFUSED),
    c("hprof-summary --top -1 dump.hprof", "file", USAGE),
    c("trace-report mail.trace", "file", OK),
    c("trace-report nothing.trace", "file", REFUSED),
    c("trace-report garbage.bin", "file", REFUSED),
    c("trace-report --top -1 mail.trace", "file", USAGE),
    c("check-config good.toml", "file", OK),
    c("check-config bad.toml", "file", USAGE),
]


@pytest.fixture(autouse=True)
def workdir(monkeypatch, tmp_path) -> Path:
    """Never the developer's own config; files of the "file" situation in the work dir."""
    monkeypatch.delenv("DDMD_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "dump.hprof").write_bytes(dump_bytes(sim_heap_content(MAIL)))
    (work / "mail.trace").write_bytes(build_trace(default_recording()))
    (work / "garbage.bin").write_bytes(b"hello world\n")
    (work / "good.toml").write_text("[debugger]\ncurrent_port = 8700\n")
    (work / "bad.toml").write_text("[debugger]\ncurrent_port = 'x'\n")
    return work


def situation(case: Case, monkeypatch: Any, tmp_path: Path) -> list[str]:
    """Set the situation up; the arguments to add."""
    if case.situation == "file":
        return []
    if case.situation == "down":
        monkeypatch.setattr(cli_client, "make_transport", lambda: None)
        return ["--control", f"127.0.0.1:{closed_port()}"]
    registry = world()
    gone = ProfVm.android("emulator-5554/4000", app="com.example.gone", package="gone")
    gone.failures["refresh_threads"] = VmGone("com.example.gone disconnected")
    refuses = ProfVm.android("emulator-5554/4001", app="com.example.refuses", package="r")
    refuses.failures["cause_gc"] = DdmFailed("HPGC failed on com.example.refuses: busy")
    registry.add(gone)
    registry.add(refuses)
    if case.situation == "current":
        registry.select("emulator-5554/3101")
    captures = tmp_path / "captures"
    captures.mkdir(exist_ok=True)
    book = PortBook(tmp_path / "ports.json", PortRange(8600, 8699))
    book.record("emulator-5554|com.example.mail", 8600)
    book.save()
    routes = []
    if case.situation.startswith("events"):
        routes = [canned_events("daemon.stopping" if case.situation == "events ok" else None)]
    Daemon(registry).route(
        monkeypatch,
        captures,
        extra_routes=routes,
        ports=VmPorts(book, "127.0.0.1"),
        token="s3cret" if case.situation == "token" else "",
        health={"adb": {"enabled": "auto", "config": None}},
    )
    return []


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_exit_code(case: Case, monkeypatch, tmp_path) -> None:
    extra = situation(case, monkeypatch, tmp_path)
    result = CliRunner().invoke(main, [*case.args, *extra])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == case.code, result.output
    if case.code != OK:
        # It says why: on stderr ("ddmd COMMAND: ..."; click's usage errors "Error: ..."),
        # or as the answer itself (threads, heap, allocs --status: "not available: ...").
        said = result.stderr if result.stderr.strip() else result.stdout
        assert said.strip(), result.output
        answers = ("not available", "does not offer", '"supported": false')  # the answer's own
        assert said.startswith(("ddmd ", "Usage:", "Error:")) or any(a in said for a in answers)


def test_every_client_command_has_each_situation() -> None:
    """Each command about a VM is run with a VM that works, with TARGET left out, with a VM
    that lacks the feature, with an unknown TARGET, with no current VM, and without a daemon."""
    about_a_vm = ("threads", "heap", "gc", "stack", "attach", "trace", "allocs", "hprof", "kill")
    for command in about_a_vm:
        rows = [case for case in CASES if case.args[0] == command]
        codes = {case.code for case in rows}
        assert codes == {OK, REFUSED, USAGE, NO_DAEMON}, command
        assert any(case.situation == "current" for case in rows), command
        assert any(case.situation == "none" and len(case.args) <= 3 and case.code == USAGE
                   for case in rows), command  # fmt: skip
    commands = {case.args[0] for case in CASES}
    assert commands >= {
        *about_a_vm, "clients", "devices", "extensions", "select", "logcat", "ports", "events",
        "hprof-summary", "trace-report", "check-config",
    }  # fmt: skip


# ------------------------------------------------------------------------------ --json errors

#: Exit code -> the kinds of error it can have (docs/cli.md's "Errors with --json").
KINDS = {REFUSED: {"not-available", "failed"}, USAGE: {"target", "usage", "config"}}
KINDS[NO_DAEMON] = {"no-daemon"}
#: Commands that print JSON lines as they come, before an error can end them.
STREAMS = ("events", "logcat")


#: A log line of the in-process daemon (its console log shares the captured stdout).
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")


def printed(stdout: str) -> list[str]:
    """What the command printed: stdout without the in-process daemon's log lines."""
    return [line for line in stdout.splitlines() if not LOG_LINE.match(line)]


def json_error(stdout: str) -> dict[str, Any]:
    """The error's one JSON line (the last line the command printed), checked for its shape."""
    body = json.loads(printed(stdout)[-1])
    assert list(body) == ["error"], body
    error = body["error"]
    assert list(error) == ["kind", "message", "candidates"], error
    assert isinstance(error["message"], str)
    assert error["message"]
    assert isinstance(error["candidates"], list)
    return dict(error)


def takes_json(command: str) -> bool:
    found = main.get_command(click.Context(main), command)
    return found is not None and any(p.name == "as_json" for p in found.params)


JSON_CASES = [
    case
    for case in CASES
    if case.code != OK and takes_json(case.args[0]) and "--bogus" not in case.args
]


@pytest.mark.parametrize("case", JSON_CASES, ids=lambda case: case.id)
def test_with_json_every_error_is_one_json_shape_on_stdout(case: Case, monkeypatch, tmp_path):
    extra = situation(case, monkeypatch, tmp_path)
    result = CliRunner().invoke(main, [*case.args, "--json", *extra])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == case.code, result.output
    if result.stderr.startswith(("Usage:", "Error:")):
        return  # click's own refusal of the command line, before the command runs
    error = json_error(result.stdout)
    assert error["kind"] in KINDS[case.code], error
    if case.args[0] not in STREAMS:
        assert len(printed(result.stdout)) == 1, result.stdout  # nothing but the error


def test_json_error_for_an_unknown_target_has_the_candidates(monkeypatch, tmp_path):
    situation(c("threads nosuch", "none", USAGE), monkeypatch, tmp_path)
    result = CliRunner().invoke(main, ["threads", "nosuch", "--json"])
    assert result.exit_code == USAGE
    error = json_error(result.stdout)
    assert error["kind"] == "target"
    assert error["message"] == "no VM matches 'nosuch'; candidates:"
    assert any(MAIL in candidate for candidate in error["candidates"])
    assert len(error["candidates"]) >= 3


def test_json_error_for_heap_segments_on_a_vm_without_them(monkeypatch, tmp_path):
    situation(c("heap maps --segments", "none", REFUSED), monkeypatch, tmp_path)
    result = CliRunner().invoke(main, ["heap", "maps", "--segments", "--json"])
    assert result.exit_code == REFUSED
    error = json_error(result.stdout)
    assert error["kind"] == "not-available"
    assert "heap_segments" in error["message"]  # the daemon's sentence (this fake's)
    assert error["candidates"] == []
    # The same shape when the CLI itself sees that the VM lacks it (no heap, no threads).
    for args in (["heap", "maps", "--json"], ["threads", "maps", "--json"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == REFUSED
        assert json_error(result.stdout)["kind"] == "not-available", args
        assert len(printed(result.stdout)) == 1


def test_json_error_when_no_daemon_runs(monkeypatch, tmp_path):
    control = ["--control", f"127.0.0.1:{closed_port()}"]
    for command in (["clients"], ["threads", "mail"], ["heap", "mail", "--segments"]):
        result = CliRunner().invoke(main, [*command, "--json", *control])
        assert result.exit_code == NO_DAEMON
        error = json_error(result.stdout)
        assert error["kind"] == "no-daemon"
        assert error["message"].startswith("no daemon is answering at http://127.0.0.1:")
