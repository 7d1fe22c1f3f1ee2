"""`ddmd logcat` (and `ddmd threads --watch` across an app's restart), driven by click's CliRunner.

The logcat tests fake the daemon with an httpx MockTransport serving canned JSON and SSE bodies
(the contract of ddmd/control/logcat.py); each scripted stream answer is a body, an exception
to raise, or, once the script is used up, Ctrl-C. The threads test uses the in-process app.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

import httpx
import pytest
import trio
from click.testing import CliRunner, Result

from ddmd.cli import client as cli_client
from ddmd.cli import logcat as cli_logcat
from ddmd.cli.client import EXIT_API_ERROR, EXIT_NO_DAEMON, EXIT_TARGET, threads
from ddmd.cli.logcat import LogcatPrinter, logcat
from ddmd.cli.main import main
from ddmd.control.app import create_app

from .fakes import FakeVm, make_registry

SERIAL = "emulator-5554"
MAIL = "com.example.mail"
WORKSTATION_SENTENCE = (
    "JVM pid 4242 runs on a local port, not on an Android device: it has no device log "
    "(only Android devices and emulators keep a log ddmd can read)"
)


@pytest.fixture(autouse=True)
def no_user_config(monkeypatch, tmp_path):
    """Never read the developer's own config; no NO_COLOR from the environment running tests."""
    monkeypatch.delenv("DDMD_CONFIG", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(cli_logcat, "RECONNECT_DELAYS", (0.0, 0.0, 0.0))


def vm_json(vm_id: str, **fields: Any) -> dict[str, Any]:
    serial, slash, pid = vm_id.partition("/")
    vm: dict[str, Any] = {
        "id": vm_id,
        "device": serial if slash else None,
        "pid": int(pid) if slash else 4242,
        "app": MAIL,
        "package": MAIL,
        "name": MAIL,
        "current": False,
    }
    vm.update(fields)
    return vm


def line(seq: int, message: str = "synced 3 messages", **fields: Any) -> dict[str, Any]:
    item: dict[str, Any] = {
        "kind": "line",
        "seq": seq,
        "device": SERIAL,
        "time": "2024-03-14T12:00:01.123456Z",
        "pid": 4242,
        "tid": 4250,
        "level": "I",
        "tag": "MailSync",
        "message": message,
        "app": MAIL,
        "buffer": "main",
        "crash": None,
    }
    item.update(fields)
    return item


def restart(seq: int, old: int = 4242, new: int = 4301) -> dict[str, Any]:
    return {
        "kind": "restart",
        "seq": seq,
        "device": SERIAL,
        "app": MAIL,
        "old_pid": old,
        "new_pid": new,
        "text": f"{MAIL} restarted (pid {old} \u2192 {new})",
    }


def sse(*batches: list[dict[str, Any]], app: str | None = MAIL) -> bytes:
    """A stream body as the daemon writes it: retry, a comment, logcat.opened, batches."""
    head = {"device": SERIAL, "app": app}
    frames = [b"retry: 2000\n\n: ddmd logcat\n\n"]
    events = [{"event": "logcat.opened", "ts": "t", **head}]
    events += [{"event": "logcat.lines", "ts": "t", **head, "items": b} for b in batches]
    for event in events:
        frames.append(f"event: {event['event']}\ndata: {json.dumps(event)}\n\n".encode())
        frames.append(b": keepalive\n\n")
    return b"".join(frames)


class FakeDaemon:
    """The control API's answers for the logcat command; `requests` keeps what was asked."""

    def __init__(self) -> None:
        self.vms: dict[str, dict[str, Any]] = {
            f"{SERIAL}/4242": vm_json(f"{SERIAL}/4242", current=True),
            "tcp:8000": vm_json(
                "tcp:8000", app=None, package=None, name="JVM pid 4242", device=None
            ),
        }
        self.recent: list[dict[str, Any]] = []
        self.devices: list[dict[str, Any]] = [{"serial": SERIAL, "state": "device"}]
        self.streams: list[bytes | BaseException] = []
        self.requests: list[httpx.Request] = []

    def query(self, index: int = -1, path: str | None = None) -> list[tuple[str, str]]:
        wanted = [r for r in self.requests if path is None or r.url.path == path]
        return parse_qsl(wanted[index].url.query.decode(), keep_blank_values=True)

    @property
    def paths(self) -> list[str]:
        return [r.url.path for r in self.requests]

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if path == "/api/v1/current":
            current = [vm for vm in self.vms.values() if vm.get("current")]
            return httpx.Response(200, json={"vm": current[0] if current else None})
        if path == "/api/v1/devices":
            return httpx.Response(200, json=self.devices)
        if path == "/api/v1/logcat":
            return httpx.Response(
                200, json={"device": SERIAL, "app": MAIL, "items": self.recent, "next": 9}
            )
        if path == "/api/v1/logcat/stream":
            if not self.streams:
                raise KeyboardInterrupt  # the user pressed Ctrl-C
            answer = self.streams.pop(0)
            if isinstance(answer, BaseException):
                raise answer
            return httpx.Response(
                200, content=answer, headers={"content-type": "text/event-stream"}
            )
        if path.startswith("/api/v1/vms/"):
            target = path.removeprefix("/api/v1/vms/")
            if target.endswith("/logcat"):
                return httpx.Response(501, json={"error": WORKSTATION_SENTENCE})
            for vm in self.vms.values():
                if target in (vm["id"], str(vm["pid"])) or target in str(vm["package"]):
                    return httpx.Response(200, json={"vm": vm, "threads": None})
            return httpx.Response(
                404, json={"error": f"no VM matches {target!r}", "candidates": list(self.vms)}
            )
        return httpx.Response(404, json={"error": "Not Found"})


@pytest.fixture
def daemon(monkeypatch) -> FakeDaemon:
    fake = FakeDaemon()
    monkeypatch.setattr(cli_client, "make_transport", lambda: httpx.MockTransport(fake.handle))
    return fake


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(logcat, list(args), catch_exceptions=False, env=env)


# ------------------------------------------------------------------------------ --json


def test_json_dump_prints_the_api_items_one_a_line(daemon):
    daemon.recent = [line(1), restart(2), line(3, crash="java", level="E")]
    result = run("mail", "-d", "--json")
    assert result.exit_code == 0, result.output
    printed = [json.loads(text) for text in result.stdout.splitlines()]
    assert printed == daemon.recent
    assert set(printed[0]) == {
        "kind", "seq", "device", "time", "pid", "tid", "level", "tag", "message", "app",
        "buffer", "crash",
    }  # fmt: skip
    assert set(printed[1]) == {"kind", "seq", "device", "app", "old_pid", "new_pid", "text"}
    # The target is resolved once, then the log is asked for by device and app name.
    assert daemon.paths == ["/api/v1/vms/mail", "/api/v1/logcat"]
    assert daemon.query() == [("device", SERIAL), ("app", MAIL)]


def test_json_follow_prints_stream_items(daemon):
    daemon.streams = [sse([line(1), line(2)], [restart(3), line(4, pid=4301)])]
    result = run("mail", "--json")
    assert result.exit_code == 0, result.output
    assert [json.loads(t)["seq"] for t in result.stdout.splitlines()] == [1, 2, 3, 4]


def test_help_documents_the_json_fields():
    result = CliRunner().invoke(logcat, ["--help"])
    for name in ("kind", "seq", "time", "pid", "tid", "level", "tag", "message", "buffer"):
        assert f'"{name}"' in result.stdout
    assert '"old_pid", "new_pid", "text"' in result.stdout


# ------------------------------------------------------------------------------ following


def test_follows_the_app_by_name_and_prints_the_restart_separator(daemon):
    daemon.streams = [sse([line(1)], [restart(2)], [line(3, pid=4301, message="started")])]
    result = run(f"{SERIAL}/4242")
    assert result.exit_code == 0, result.output  # the stream went on; Ctrl-C ended it: exit 0
    lines = result.stdout.splitlines()
    assert lines[1] == f"\u2500\u2500 {MAIL} restarted (pid 4242 \u2192 4301) \u2500\u2500"
    assert lines[2].endswith(" I  started")
    # The canned stream then ends: a reconnection is tried (and meets Ctrl-C).
    assert result.stderr.startswith("ddmd logcat: the daemon at ")
    assert "closed the log stream; reconnecting in 0 s (1/3)" in result.stderr
    # By device and app (which outlives the pid), not by the VM route.
    assert daemon.paths[-1] == "/api/v1/logcat/stream"
    assert daemon.query(0, "/api/v1/logcat/stream") == [("device", SERIAL), ("app", MAIL)]


def test_no_target_follows_the_current_vm(daemon):
    daemon.streams = [sse([line(1)])]
    result = run()
    assert result.exit_code == 0, result.output
    assert daemon.paths[0] == "/api/v1/current"
    assert ("app", MAIL) in daemon.query(0, "/api/v1/logcat/stream")


def test_no_target_and_no_current_vm(daemon):
    daemon.vms[f"{SERIAL}/4242"]["current"] = False
    result = run()
    assert result.exit_code == EXIT_TARGET
    assert result.stderr.startswith("ddmd logcat: no VM is current: give a TARGET")


def test_unknown_target_lists_the_candidates(daemon):
    result = run("nothing")
    assert result.exit_code == EXIT_TARGET
    assert "no VM matches 'nothing'" in result.stderr


def test_the_package_names_the_app_followed(daemon):
    daemon.vms[f"{SERIAL}/4242"].update(app=f"{MAIL}:sync", package=MAIL)
    daemon.streams = [sse([line(1)])]
    assert run("4242").exit_code == 0
    assert ("app", MAIL) in daemon.query(0, "/api/v1/logcat/stream")


def test_reconnects_after_the_last_item_seen(daemon):
    daemon.streams = [
        sse([line(1), line(2)]),  # then the connection closes
        httpx.ReadError("connection reset"),
        sse([line(2), line(3, message="after the break")]),  # 2 again: not printed twice
    ]
    result = run("mail", "--json")
    assert result.exit_code == 0, result.output
    assert [json.loads(t)["seq"] for t in result.stdout.splitlines()] == [1, 2, 3]
    streams = [r for r in daemon.requests if r.url.path == "/api/v1/logcat/stream"]
    assert [dict(parse_qsl(r.url.query.decode())).get("after") for r in streams] == [
        None,
        "2",
        "2",
        "3",
    ]
    assert "closed the log stream; reconnecting in 0 s (1/3)" in result.stderr
    assert "broke (ReadError: connection reset); reconnecting in 0 s (2/3)" in result.stderr
    assert f"reconnected to {MAIL}" in result.stderr


def test_reconnecting_gives_up_after_the_bounded_retries(daemon):
    daemon.streams = [sse([line(1)]), *[httpx.ConnectError("refused")] * 4]
    result = run("mail")
    assert result.exit_code == EXIT_NO_DAEMON
    assert result.stderr.count("reconnecting in") == 3
    assert result.stderr.splitlines()[-1].startswith("ddmd logcat: no daemon is answering")


def test_no_daemon_at_the_start_is_not_retried(monkeypatch):
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    monkeypatch.setattr(cli_client, "make_transport", lambda: httpx.MockTransport(refuse))
    result = run("mail")
    assert result.exit_code == EXIT_NO_DAEMON
    assert "reconnecting" not in result.stderr


def test_since_and_filters_are_passed_to_the_daemon(daemon):
    daemon.streams = [sse([line(1)])]
    args = ["mail", "--level", "w", "--tag", "MailSync", "--tag", "-Chatty", "-t", "-Gc"]
    result = run(*args, "--grep", "sync|fetch", "--since", "5m")
    assert result.exit_code == 0, result.output
    assert daemon.query(0, "/api/v1/logcat/stream") == [
        ("device", SERIAL),
        ("app", MAIL),
        ("level", "W"),
        ("tag", "MailSync"),
        ("tag", "-Chatty"),
        ("tag", "-Gc"),
        ("grep", "sync|fetch"),
        ("since", "5m"),
    ]


def test_tag_exclusion_written_with_equals(daemon):
    daemon.recent = []
    assert run("mail", "-d", "--tag=-Chatty").exit_code == 0
    assert ("tag", "-Chatty") in daemon.query()


@pytest.mark.parametrize("since", ["5 minutes", "-3", "m", "1d"])
def test_since_is_checked_before_asking(daemon, since):
    result = run("mail", "--since", since)
    assert result.exit_code == 2
    assert "give a number of lines (200) or a duration (30s, 5m, 2h)" in result.stderr
    assert daemon.requests == []


def test_a_bad_grep_is_a_usage_error(daemon):
    result = run("mail", "--grep", "(")
    assert result.exit_code == 2
    assert "is not a regular expression" in result.stderr


def test_a_workstation_jvm_gets_the_daemons_sentence(daemon):
    result = run("tcp:8000")
    assert result.exit_code == EXIT_API_ERROR  # as other features a VM lacks (HTTP 501)
    assert result.stderr == f"ddmd logcat: {WORKSTATION_SENTENCE}\n"
    assert daemon.paths == ["/api/v1/vms/tcp:8000", "/api/v1/vms/tcp:8000/logcat"]


def test_all_is_the_whole_device_with_an_app_column(daemon):
    daemon.recent = [line(1), line(2, app=None, pid=999, tag="vold", message="mounted")]
    result = run("mail", "--all", "-d")
    assert result.exit_code == 0, result.output
    assert daemon.query() == [("device", SERIAL), ("all", "1")]
    first, second = result.stdout.splitlines()
    assert first.startswith(MAIL.ljust(24) + " ")
    assert second.startswith("pid 999".ljust(24) + " ")


def test_all_with_a_device_needs_no_vm(daemon):
    daemon.recent = [line(1)]
    assert run("--device", "R58M", "--all", "-d").exit_code == 0
    assert daemon.paths == ["/api/v1/logcat"]
    assert daemon.query() == [("device", "R58M"), ("all", "1")]


def test_all_alone_takes_the_only_device_as_adb_does(daemon):
    # No TARGET, no --device, no current VM: one device online is the one meant.
    daemon.vms[f"{SERIAL}/4242"]["current"] = False
    daemon.devices = [{"serial": SERIAL, "state": "device"}, {"serial": "R58M", "state": "offline"}]
    daemon.recent = [line(1)]
    result = run("--all", "-d")
    assert result.exit_code == 0, result.output
    assert daemon.paths == ["/api/v1/devices", "/api/v1/logcat"]
    assert daemon.query() == [("device", SERIAL), ("all", "1")]
    assert result.stdout.startswith(MAIL)


def test_all_alone_with_several_devices_says_what_to_give(daemon):
    daemon.vms[f"{SERIAL}/4242"]["current"] = False
    daemon.devices = [{"serial": SERIAL, "state": "device"}, {"serial": "R58M", "state": "device"}]
    result = run("--all", "-d")
    assert result.exit_code == EXIT_TARGET
    assert result.stderr == (
        "ddmd logcat: no VM is current: give a TARGET (see 'ddmd clients'), or --device SERIAL "
        "--all\n"
    )


def test_ctrl_c_ends_quietly(daemon):
    result = run("mail")  # no stream scripted: the first connection meets Ctrl-C
    assert result.exit_code == 0
    assert result.stdout == ""
    assert result.stderr == ""


def test_registered_on_the_group():
    assert main.get_command(None, "logcat") is logcat  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ text output


def test_pidcat_layout_blanks_repeated_tags_and_indents_continuations(daemon):
    daemon.recent = [
        line(1, message="first"),
        line(2, message="second\nmore of it", level="W"),
        line(3, tag="Http", message="GET /inbox", level="D"),
    ]
    result = run("mail", "-d")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "MailSync".rjust(23) + "  I  first",
        " " * 23 + "  W  second",
        " " * 28 + "more of it",
        "Http".rjust(23) + "  D  GET /inbox",
    ]


def test_a_final_line_break_prints_no_empty_line():
    assert LogcatPrinter().lines(line(1, message="backtrace:\n")) == [
        "MailSync".rjust(23) + "  I  backtrace:"
    ]


def test_with_all_a_tag_is_blanked_only_for_the_same_app_and_pid():
    printer = LogcatPrinter(show_app=True)
    about = printer.lines(line(1, pid=600, tag="ActivityManager", message="mail died"))[0]
    own = printer.lines(line(2, pid=600, tag="ActivityManager", app=None, message="start"))[0]
    again = printer.lines(line(3, pid=600, tag="ActivityManager", app=None, message="more"))[0]
    assert "ActivityManager" in about
    assert "ActivityManager" in own
    assert again == "pid 600".ljust(25) + " " * 24 + " I  more"


def test_crash_lines_are_marked(daemon):
    daemon.recent = [
        line(1, message="ok"),
        line(2, tag="AndroidRuntime", level="E", crash="java", message="FATAL EXCEPTION: main"),
        line(3, tag="AndroidRuntime", level="E", crash="java", message="\tat a.B.c(B.java:1)"),
        line(4, tag="ActivityManager", level="E", crash="anr", message="ANR in " + MAIL),
    ]
    out = run("mail", "-d").stdout.splitlines()
    assert out[0].endswith(" I  ok")
    assert out[1].endswith(" E  !! CRASH FATAL EXCEPTION: main")
    assert out[2].endswith(" E  !! \tat a.B.c(B.java:1)")
    assert out[3].endswith(" E  !! ANR ANR in " + MAIL)


def test_each_apps_death_gets_its_badge():
    printer = LogcatPrinter(show_app=True)
    said = [
        printer.lines(line(n, pid=600, tag="ActivityManager", app=app, crash="died"))[0]
        for n, app in enumerate((MAIL, "com.example.maps", "com.example.maps"), 1)
    ]
    assert ["DIED" in text for text in said] == [True, True, False]


def test_time_column(daemon, monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        daemon.recent = [line(1)]
        out = run("mail", "-d", "--time").stdout
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert out.startswith("03-14 12:00:01.123 " + "MailSync".rjust(23))


def test_no_colours_into_a_pipe(daemon):
    daemon.recent = [line(1), restart(2), line(3, crash="java", level="E")]
    result = run("mail", "-d")
    assert "\x1b[" not in result.stdout


def test_colours_on_a_terminal_but_not_with_no_color(daemon, monkeypatch):
    monkeypatch.setattr(cli_logcat, "_is_tty", lambda: True)
    daemon.recent = [line(1, level="E")]
    assert "\x1b[" in run("mail", "-d").stdout
    assert "\x1b[" not in run("mail", "-d", env={"NO_COLOR": ""}).stdout
    assert "\x1b[" not in run("mail", "-d", "--no-color").stdout


def test_color_forces_colours(daemon):
    daemon.recent = [line(1, level="E"), restart(2), line(3, crash="java", level="F")]
    out = run("mail", "-d", "--color", env={"NO_COLOR": "1"}).stdout.splitlines()
    assert "\x1b[30m\x1b[41m E \x1b[0m" in out[0]  # E: black on red, as pidcat
    assert "\x1b[1m" in out[1]  # the separator in bold
    assert "\x1b[31m\x1b[47m\x1b[1m F \x1b[0m" in out[2]  # F: red on white
    assert "\x1b[37m\x1b[41m\x1b[1m CRASH \x1b[0m" in out[2]


def test_tag_colours_are_stable():
    printer = LogcatPrinter(color=True)
    first = printer.lines(line(1, tag="Alpha"))[0]
    printer.lines(line(2, tag="Beta"))
    again = printer.lines(line(3, tag="Alpha"))[0]
    assert first.split("Alpha")[0] == again.split("Alpha")[0]  # same escape before the tag
    colours = {LogcatPrinter(color=True).lines(line(1, tag=t))[0][:5] for t in "ABCDEFGHIJ"}
    assert len(colours) > 1


# ------------------------------------------------------------------------------ threads --watch


def watch_through(monkeypatch, steps: list[Callable[[], None]]) -> None:
    """Each trio.sleep of the watch loop first runs the next step (a VM dies, one appears)."""

    async def sleep(seconds: float) -> None:
        if steps:
            steps.pop(0)()
        await trio.lowlevel.checkpoint()

    monkeypatch.setattr(trio, "sleep", sleep)


def mail_vm(pid: int) -> FakeVm:
    return FakeVm.android(f"{SERIAL}/{pid}", app=MAIL, package=MAIL)


def test_threads_watch_follows_the_app_into_its_next_process(monkeypatch):
    registry = make_registry(mail_vm(4242))
    app = create_app(registry)
    monkeypatch.setattr(cli_client, "make_transport", lambda: httpx.ASGITransport(app=app))
    watch_through(
        monkeypatch,
        [
            lambda: registry.remove(f"{SERIAL}/4242"),  # after the first table: the app dies
            lambda: None,  # still gone at the next look
            lambda: registry.add(mail_vm(4301)),  # and it is back
        ],
    )
    args = ["4242", "--watch", "--interval", "0.01", "--count", "2"]
    result = CliRunner().invoke(threads, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert f"waiting for {MAIL} to start again" in lines
    assert f"{MAIL} restarted (pid 4242 \u2192 4301)" in lines
    tables = [text for text in lines if text.startswith("threads of VM")]
    assert [f"{SERIAL}/4242" in tables[0], f"{SERIAL}/4301" in tables[1]] == [True, True]
    assert lines.index(f"{MAIL} restarted (pid 4242 \u2192 4301)") < lines.index(tables[1])


def test_threads_watch_json_keeps_notes_off_stdout(monkeypatch):
    registry = make_registry(mail_vm(4242))
    app = create_app(registry)
    monkeypatch.setattr(cli_client, "make_transport", lambda: httpx.ASGITransport(app=app))

    def restart_now() -> None:
        registry.remove(f"{SERIAL}/4242")
        registry.add(mail_vm(4301))

    watch_through(monkeypatch, [restart_now])
    args = [MAIL, "--watch", "--json", "--interval", "0.01", "--count", "2"]
    result = CliRunner().invoke(threads, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    # (The registry's own log lines also land in the captured stdout: only JSON is read.)
    printed = [text for text in result.stdout.splitlines() if text.startswith("{")]
    ids = [json.loads(text)["vm"]["id"] for text in printed]
    assert ids == [f"{SERIAL}/4242", f"{SERIAL}/4301"]
    assert result.stderr == f"{MAIL} restarted (pid 4242 \u2192 4301)\n"


def test_threads_without_watch_does_not_wait_for_a_gone_vm(monkeypatch):
    app = create_app(make_registry(mail_vm(4242)))
    monkeypatch.setattr(cli_client, "make_transport", lambda: httpx.ASGITransport(app=app))
    result = CliRunner().invoke(threads, ["4301"], catch_exceptions=False)
    assert result.exit_code == EXIT_TARGET
    assert "no VM matches '4301'" in result.stderr


def test_threads_watch_on_a_terminal_keeps_the_restart_in_the_header(monkeypatch):
    registry = make_registry(mail_vm(4242))
    app = create_app(registry)
    monkeypatch.setattr(cli_client, "make_transport", lambda: httpx.ASGITransport(app=app))
    monkeypatch.setattr(cli_client, "_is_tty", lambda: True)

    def restart_now() -> None:
        registry.remove(f"{SERIAL}/4242")
        registry.add(mail_vm(4301))

    watch_through(monkeypatch, [restart_now])
    args = ["4242", "--watch", "--interval", "0.01", "--count", "2"]
    result = CliRunner().invoke(threads, args, catch_exceptions=False, color=True)
    assert result.exit_code == 0, result.output
    frames = result.stdout.split("\x1b[H\x1b[2J")[1:]
    assert len(frames) == 2
    assert "restarted" not in frames[0].splitlines()[0]  # (printed after it, then redrawn)
    assert (
        frames[1]
        .splitlines()[0]
        .endswith(f"(Ctrl-C to stop) -- {MAIL} restarted (pid 4242 \u2192 4301)")
    )
