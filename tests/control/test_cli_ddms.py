"""`ddmd trace`, `ddmd allocs`, `ddmd hprof` and `ddmd kill`, driven by click's CliRunner
against a fake daemon: a small Starlette app speaking the issue-13 routes of the control API
(`/work/notes/api13.md`) over the CLI's transport seam. It serves a real method trace (the
simulator's, `ddmd.sim.trace`) and a real Android heap dump (`ddmd.sim.hprof`), with the
report and histogram the daemon computes from them, and records every request it gets, so
the tests can say which requests a command made and in what order.
"""

from __future__ import annotations

import json
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import httpx
import pytest
from click.testing import CliRunner, Result
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ddmd.cli import client as cli_client
from ddmd.cli import profiling
from ddmd.cli.client import EXIT_API_ERROR, EXIT_CONFIG, EXIT_NO_DAEMON, EXIT_TARGET
from ddmd.cli.profiling import (
    allocs,
    converted_name,
    find_hprof_conv,
    hprof,
    java_name,
    kill,
    trace,
)
from ddmd.cli.trace import report_json
from ddmd.protocol.hprof import summarise_file
from ddmd.protocol.trace import parse_trace
from ddmd.sim.hprof import dump_bytes, sim_heap_content
from ddmd.sim.trace import DEFAULT_CALL_COUNTS, build_trace, default_recording
from tests.actors.needs import skip_or_fail

MAIL = "com.example.mail"
MAPS = "com.example.maps:remote"
TRACE_NAME = "com.example.mail-20261124-101500.trace"
HPROF_NAME = "com.example.mail-20261124-101501.hprof"
HPROF_CONV = Path("/usr/lib/android-sdk/platform-tools/hprof-conv")
NO_ALLOCS = "this VM does not offer the allocation tracker (Android 12 removed it)"
NO_HPROF = "this VM does not offer heap dumps (Android 12 removed them)"


@pytest.fixture(autouse=True)
def no_user_config(monkeypatch, tmp_path):
    """Never read the developer's own ~/.config/ddmd/config.toml."""
    monkeypatch.delenv("DDMD_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path))


# ------------------------------------------------------------------------------ the fake daemon


def _vm_json(vm_id: str, app: str, package: str, pid: int) -> dict[str, Any]:
    return {
        "id": vm_id,
        "name": app,
        "app": app,
        "package": package,
        "pid": pid,
        "device": None,
        "source": "tcp",
        "ddm": True,
    }


def _allocations() -> dict[str, Any]:
    """What a VM sends in REAL, as the daemon would pass it on: descriptors, newest first."""
    inbox = {"class": "Lcom/example/mail/Inbox;", "method": "parse", "file": "Inbox.java"}
    return {
        "enabled": True,
        "allocations": [
            {
                "size": 32,
                "class": "Lcom/example/mail/Message;",
                "thread": 1,
                "frames": [
                    {
                        "class": "Lcom/example/mail/Message;",
                        "method": "<init>",
                        "file": "Message.java",
                        "line": 24,
                    },
                    {**inbox, "line": 88},
                ],
            },
            {
                "size": 1040,
                "class": "[B",
                "thread": 22,
                "frames": [
                    {"class": "Ljava/lang/System;", "method": "arraycopy", "file": None, "line": -2}
                ],
            },
            {"size": 24, "class": "[[Ljava/lang/String;", "thread": 1, "frames": []},
        ],
        "by_class": [
            {"class": "[B", "count": 1, "bytes": 1040},
            {"class": "Lcom/example/mail/Message;", "count": 1, "bytes": 32},
        ],
        "by_site": [
            {"site": "Ljava/lang/System;.arraycopy (Native Method)", "count": 1, "bytes": 1040},
            {
                "site": "Lcom/example/mail/Message;.<init> (Message.java:24)",
                "count": 1,
                "bytes": 32,
            },
        ],
    }


@dataclass
class FakeDaemon:
    trace_bytes: bytes
    hprof_bytes: bytes
    hprof_file: Path
    report_top: int = 20
    histogram_top: int = 20
    short_download: bool = False
    calls: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    vms: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {
            "tcp:8000": _vm_json("tcp:8000", MAIL, MAIL, 3101),
            "tcp:8002": _vm_json("tcp:8002", MAPS, "com.example.maps", 3103),
        }
    )
    tracing: str = "off"
    allocs_on: bool = False
    profiling_says_allocs: bool = True  # whether GET .../profiling has "allocs"
    captures: dict[str, bytes] = field(default_factory=dict)

    def paths(self) -> list[str]:
        return [f"{method} {path}" for method, path, _ in self.calls]

    # -------------------------------------------------------------------- helpers

    def _resolve(self, target: str) -> dict[str, Any] | JSONResponse:
        if target in self.vms:
            return self.vms[target]
        found = [vm for vm in self.vms.values() if target in vm["app"]]
        if len(found) == 1:
            return found[0]
        return JSONResponse(
            {
                "error": f"no VM matches {target!r}" if not found else f"{target!r} is ambiguous",
                "target": target,
                "candidates": [f"{vm['id']} {vm['app']}" for vm in self.vms.values()],
            },
            status_code=404 if not found else 409,
        )

    def _modern(self, vm: dict[str, Any]) -> bool:
        return vm["app"] == MAPS

    def _features(self, vm: dict[str, Any]) -> dict[str, Any]:
        modern = self._modern(vm)
        return {
            "trace": {"available": True, "reason": None, "modes": ["streaming"], "sampling": True},
            "allocs": {"available": not modern, "reason": NO_ALLOCS if modern else None},
            "hprof": {
                "available": not modern,
                "reason": NO_HPROF if modern else None,
                "mode": None if modern else "streaming",
            },
            "kill": {"available": True, "reason": None},
        }

    # -------------------------------------------------------------------- routes

    async def dispatch(self, request: Request) -> Response:
        self.calls.append((request.method, request.url.path, dict(request.query_params)))
        path = request.url.path
        if path.startswith("/api/v1/captures/"):
            name = path.removeprefix("/api/v1/captures/")
            if name not in self.captures:
                return JSONResponse({"error": f"no capture {name!r}"}, status_code=404)
            body = self.captures[name]
            if self.short_download:
                body = body[: len(body) // 2]
            return Response(
                body,
                media_type="application/octet-stream",
                headers={"Content-Disposition": f"attachment; filename={name}"},
            )
        rest = path.removeprefix("/api/v1/vms/")
        for suffix in (
            "/profiling",
            "/trace/start",
            "/trace/stop",
            "/allocs/start",
            "/allocs/stop",
            "/allocs",
            "/hprof",
            "/kill",
        ):
            if rest.endswith(suffix):
                target, action = rest.removesuffix(suffix), suffix
                break
        else:
            target, action = rest, ""
        vm = self._resolve(target)
        if isinstance(vm, Response):
            return vm
        return self._answer(request, vm, action)

    def _answer(self, request: Request, vm: dict[str, Any], action: str) -> Response:
        modern = self._modern(vm)
        query = request.query_params
        if action == "":
            return JSONResponse({"vm": vm, "threads": None})
        if action == "/profiling":
            on = None if modern else self.allocs_on
            body = {"vm": vm, "features": self._features(vm), "trace": self.tracing, "allocs": on}
            if not self.profiling_says_allocs:
                del body["allocs"]
            return JSONResponse(body)
        if action == "/trace/start":
            if self.tracing != "off":
                return JSONResponse({"error": "already tracing"}, status_code=409)
            self.tracing = "sampling" if "sampling_us" in query else "method"
            return JSONResponse({"trace": self.tracing, "mode": "streaming"})
        if action == "/trace/stop":
            if self.tracing == "off":
                return JSONResponse({"error": "not tracing"}, status_code=409)
            self.tracing = "off"
            self.captures[TRACE_NAME] = self.trace_bytes
            report = report_json(
                parse_trace(self.trace_bytes), top=self.report_top, file=TRACE_NAME
            )
            return JSONResponse(
                {
                    "file": TRACE_NAME,
                    "bytes": len(self.trace_bytes),
                    "download": f"/api/v1/captures/{TRACE_NAME}",
                    "report": report,
                }
            )
        if action.startswith("/allocs") and modern:
            return JSONResponse({"error": NO_ALLOCS}, status_code=501)
        if action in ("/allocs/start", "/allocs/stop"):
            self.allocs_on = action == "/allocs/start"
            return JSONResponse({"enabled": self.allocs_on})
        if action == "/allocs":
            return JSONResponse({**_allocations(), "enabled": self.allocs_on})
        if action == "/hprof":
            if modern:
                return JSONResponse({"error": NO_HPROF}, status_code=501)
            self.captures[HPROF_NAME] = self.hprof_bytes
            summary = summarise_file(self.hprof_file)
            return JSONResponse(
                {
                    "file": HPROF_NAME,
                    "bytes": len(self.hprof_bytes),
                    "download": f"/api/v1/captures/{HPROF_NAME}",
                    "histogram": {"file": HPROF_NAME, **summary.to_json(self.histogram_top)},
                }
            )
        if action == "/kill":
            del self.vms[vm["id"]]
            return JSONResponse({"killed": vm["id"], "status": int(query.get("status", "1"))})
        raise AssertionError(action)

    def app(self) -> Starlette:
        methods = ["GET", "POST"]
        return Starlette(
            routes=[
                Route("/api/v1/captures/{name:path}", self.dispatch, methods=methods),
                Route("/api/v1/vms/{rest:path}", self.dispatch, methods=methods),
            ]
        )


@pytest.fixture
def daemon(monkeypatch, tmp_path) -> FakeDaemon:
    dump = dump_bytes(sim_heap_content(MAIL))
    dump_file = tmp_path / "served.hprof"
    dump_file.write_bytes(dump)
    fake = FakeDaemon(build_trace(default_recording()), dump, dump_file)
    app = fake.app()
    monkeypatch.setattr(cli_client, "make_transport", lambda: httpx.ASGITransport(app=app))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return fake


def invoke(command: click.Command, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(command, list(args), catch_exceptions=False, input=input)


def _leftovers() -> list[str]:
    return sorted(p.name for p in Path.cwd().iterdir() if p.name.endswith(".part"))


# ------------------------------------------------------------------------------ ddmd trace


def test_trace_for_some_seconds_writes_the_trace_and_prints_its_top_methods(daemon):
    result = invoke(trace, "mail", "--seconds", "0.01", "-v")  # -v: methods by descriptors
    assert result.exit_code == 0, result.output
    written = Path(TRACE_NAME)
    assert written.read_bytes() == daemon.trace_bytes
    assert _leftovers() == []
    assert daemon.paths() == [
        "GET /api/v1/vms/mail",
        "POST /api/v1/vms/tcp:8000/trace/start",
        "POST /api/v1/vms/tcp:8000/trace/stop",
        f"GET /api/v1/captures/{TRACE_NAME}",
    ]
    assert daemon.tracing == "off"
    assert f"tracing {MAIL} (tcp:8000, pid 3101) for 0.01 s" in result.stderr
    assert f"wrote {TRACE_NAME} (" in result.stdout
    assert f"{len(daemon.trace_bytes):,} bytes" in result.stdout
    # The report of trace-report, for the local file: every method the sim recorded.
    assert f"{TRACE_NAME}: ART method trace" in result.stdout
    for method in DEFAULT_CALL_COUNTS:
        assert method in result.stdout, method


def test_ctrl_c_ends_the_trace_and_the_trace_is_stopped_and_written(daemon, monkeypatch):
    waits: list[float | None] = []

    async def interrupted(seconds: float | None) -> None:
        waits.append(seconds)
        raise KeyboardInterrupt

    monkeypatch.setattr(profiling, "_wait_for_the_end", interrupted)
    result = invoke(trace, MAIL, "-o", "app.trace")
    assert result.exit_code == 0, result.output
    assert waits == [None]  # no --seconds: until Ctrl-C
    assert f"tracing {MAIL} (tcp:8000, pid 3101) (method tracing)... press Ctrl-C to stop" in (
        result.stderr
    )
    assert "POST /api/v1/vms/tcp:8000/trace/stop" in daemon.paths()
    assert daemon.tracing == "off"
    assert Path("app.trace").read_bytes() == daemon.trace_bytes
    assert "wrote app.trace" in result.stdout


def test_ctrl_c_before_the_start_was_answered_still_stops_the_trace(daemon, monkeypatch):
    real_call = cli_client.Api.call

    async def call(self, method, path, **kwargs):
        answer = await real_call(self, method, path, **kwargs)
        if path.endswith("/trace/start"):
            raise KeyboardInterrupt  # the daemon started it; the answer never got here
        return answer

    monkeypatch.setattr(cli_client.Api, "call", call)
    result = CliRunner().invoke(trace, [MAIL, "--seconds", "5"])
    assert result.exit_code == 1
    assert "Aborted!" in result.output
    assert daemon.paths()[-1] == "POST /api/v1/vms/tcp:8000/trace/stop"
    assert daemon.tracing == "off"
    assert not Path(TRACE_NAME).exists()


def test_a_failure_while_tracing_still_stops_the_trace(daemon, monkeypatch):
    async def broken(seconds: float | None) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(profiling, "_wait_for_the_end", broken)
    result = CliRunner().invoke(trace, [MAIL, "--seconds", "5"])
    assert isinstance(result.exception, RuntimeError)
    assert daemon.paths()[-1] == "POST /api/v1/vms/tcp:8000/trace/stop"
    assert daemon.tracing == "off"


def test_trace_sampling_and_json(daemon, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    result = invoke(
        trace, MAIL, "--seconds", "0.01", "--sampling-us", "500", "-o", str(out), "--json"
    )
    assert result.exit_code == 0, result.output
    (start,) = [q for m, p, q in daemon.calls if p.endswith("/trace/start")]
    assert start == {"sampling_us": "500"}
    body = json.loads(result.stdout)
    assert body["file"] == TRACE_NAME
    assert body["path"] == str(out / TRACE_NAME)  # a directory: the daemon's name inside it
    assert body["bytes"] == len(daemon.trace_bytes)
    assert (out / TRACE_NAME).read_bytes() == daemon.trace_bytes
    assert "(sampling)" in result.stderr


def _methods_listed(text: str) -> int:
    """Rows of the all-threads by-inclusive table."""
    lines = text.split("All threads:", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if "by inclusive time" in line)
    rows = 0
    for line in lines[start + 2 :]:
        if not line.startswith("    "):
            break
        rows += 1
    return rows


def test_trace_top_uses_the_daemons_report_or_reads_the_file_for_more_rows(daemon):
    daemon.report_top = 2
    few = invoke(trace, MAIL, "--seconds", "0.01", "--top", "1")
    assert few.exit_code == 0, few.output
    assert _methods_listed(few.stdout) == 1
    more = invoke(trace, MAIL, "--seconds", "0.01", "--top", "5", "-o", "again.trace")
    assert more.exit_code == 0, more.output
    assert _methods_listed(more.stdout) == 5  # more than the daemon's 2: read from the file


def test_a_short_download_leaves_no_file(daemon):
    daemon.short_download = True
    result = invoke(trace, MAIL, "--seconds", "0.01")
    assert result.exit_code == EXIT_API_ERROR
    assert f"ended after {len(daemon.trace_bytes) // 2} of {len(daemon.trace_bytes)} bytes" in (
        result.stderr
    )
    assert f"the daemon keeps the trace as {TRACE_NAME}" in result.stderr
    assert not Path(TRACE_NAME).exists()
    assert _leftovers() == []
    assert daemon.tracing == "off"


def test_trace_of_an_unknown_target_lists_the_candidates(daemon):
    result = invoke(trace, "nothing", "--seconds", "1")
    assert result.exit_code == EXIT_TARGET
    assert "no VM matches 'nothing'" in result.stderr
    assert f"tcp:8000 {MAIL}" in result.stderr
    assert daemon.paths() == ["GET /api/v1/vms/nothing"]


def test_an_output_in_a_missing_directory_is_refused_before_tracing(daemon, tmp_path):
    result = invoke(trace, MAIL, "--seconds", "1", "-o", str(tmp_path / "nope" / "x.trace"))
    assert result.exit_code == EXIT_CONFIG
    assert "does not exist" in result.stderr
    assert daemon.calls == []


def test_trace_already_running_is_the_daemons_sentence(daemon):
    daemon.tracing = "method"
    result = invoke(trace, MAIL, "--seconds", "0.01")
    assert result.exit_code == EXIT_API_ERROR
    assert result.stderr.strip() == "ddmd trace: already tracing"


def test_no_daemon(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = invoke(trace, MAIL, "--seconds", "1", "--control", f"127.0.0.1:{port}")
    assert result.exit_code == EXIT_NO_DAEMON
    assert "no daemon is answering" in result.stderr


# ------------------------------------------------------------------------------ ddmd allocs


def test_java_names_from_descriptors():
    assert java_name("Lcom/example/Foo;") == "com.example.Foo"
    assert java_name("Lcom/example/Foo$Bar;") == "com.example.Foo$Bar"
    assert java_name("[B") == "byte[]"
    assert java_name("[[I") == "int[][]"
    assert java_name("[Ljava/lang/String;") == "java.lang.String[]"
    # Names the daemon already converted stay as they are.
    assert java_name("com.example.Foo") == "com.example.Foo"
    assert java_name("byte[]") == "byte[]"
    assert java_name("Lonely") == "Lonely"


def test_allocs_start_stop_status(daemon):
    started = invoke(allocs, MAIL, "--start")
    assert started.exit_code == 0, started.output
    assert started.stdout == f"allocation tracking is on for {MAIL} (tcp:8000, pid 3101)\n"
    assert daemon.allocs_on
    status = invoke(allocs, MAIL, "--status")
    assert status.stdout == f"allocation tracking is on for {MAIL} (tcp:8000, pid 3101)\n"
    stopped = invoke(allocs, MAIL, "--stop")
    assert stopped.stdout == f"allocation tracking is off for {MAIL} (tcp:8000, pid 3101)\n"
    assert not daemon.allocs_on
    assert [p for p in daemon.paths() if "tcp:8000" in p] == [
        "POST /api/v1/vms/tcp:8000/allocs/start",
        "GET /api/v1/vms/tcp:8000/profiling",
        "POST /api/v1/vms/tcp:8000/allocs/stop",
    ]


def test_allocs_status_asks_the_tracker_when_the_profiling_answer_does_not_say(daemon):
    daemon.profiling_says_allocs = False
    daemon.allocs_on = True
    result = invoke(allocs, MAIL, "--status")
    assert result.stdout == f"allocation tracking is on for {MAIL} (tcp:8000, pid 3101)\n"
    assert [(p, q) for m, p, q in daemon.calls if "tcp:8000" in p] == [
        ("/api/v1/vms/tcp:8000/profiling", {}),
        ("/api/v1/vms/tcp:8000/allocs", {"top": "1"}),
    ]
    # A VM without the tracker: its sentence, and no second question.
    maps = invoke(allocs, "maps", "--status")
    assert maps.stdout == f"{MAPS} (tcp:8002, pid 3103): {NO_ALLOCS}\n"
    assert not [p for m, p, q in daemon.calls if p == "/api/v1/vms/tcp:8002/allocs"]


def test_allocs_show_lists_allocations_and_summaries_in_java_names(daemon):
    result = invoke(allocs, MAIL)
    assert result.exit_code == 0, result.output
    out = result.stdout
    (query,) = [q for m, p, q in daemon.calls if p.endswith("/allocs")]
    assert query == {"top": "20"}
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("BYTES"))
    assert lines[header].split() == ["BYTES", "CLASS", "THREAD", "ALLOCATED", "IN"]
    first, second, third = lines[header + 1 : header + 4]
    assert first.split() == [
        "32",
        "com.example.mail.Message",
        "1",
        "com.example.mail.Message.<init>(Message.java:24)",
    ]
    assert second.split() == [
        "1,040",
        "byte[]",
        "22",
        "java.lang.System.arraycopy(Native",
        "Method)",
    ]
    assert third.split()[:3] == ["24", "java.lang.String[][]", "1"]
    assert "(no Java frames)" in third
    assert "by class (most bytes first):" in out
    assert ["byte[]", "1", "1,040"] in [line.split() for line in lines]
    assert ["com.example.mail.Message", "1", "32"] in [line.split() for line in lines]
    assert "by allocation site (most bytes first):" in out
    assert "java.lang.System.arraycopy (Native Method)" in out
    assert "com.example.mail.Message.<init> (Message.java:24)" in out
    assert "Lcom/" not in out
    assert "[B" not in out


def test_allocs_top_and_json(daemon):
    result = invoke(allocs, MAIL, "--show", "--top", "1")
    assert "the newest 1 of 3 allocations" in result.stdout
    assert "java.lang.String[][]" not in result.stdout
    every = invoke(allocs, MAIL, "--top", "0")
    assert "all 3 allocations" in every.stdout
    assert [q for m, p, q in daemon.calls if p.endswith("/allocs")][-1] == {"top": "65535"}
    raw = invoke(allocs, MAIL, "--json")
    # The API's JSON as it came.
    assert json.loads(raw.stdout) == {**_allocations(), "enabled": daemon.allocs_on}


def test_allocs_on_android_12_says_why_not(daemon, monkeypatch):
    started = invoke(allocs, "maps", "--start")
    assert started.exit_code == EXIT_API_ERROR
    assert started.stderr == f"ddmd allocs: {NO_ALLOCS}\n"
    status = invoke(allocs, "maps", "--status")
    assert status.exit_code == EXIT_API_ERROR  # not available: the exit-code table's 1
    assert status.stdout == f"{MAPS} (tcp:8002, pid 3103): {NO_ALLOCS}\n"
    # A sentence that names the VM itself is not prefixed with its name again.
    named = f"{MAPS} does not offer the allocation tracker (Android 12 removed it)"
    monkeypatch.setattr(sys.modules[__name__], "NO_ALLOCS", named)
    again = invoke(allocs, "maps", "--status")
    assert again.stdout == f"{named}\n"


def test_allocs_takes_one_action(daemon):
    result = CliRunner().invoke(allocs, [MAIL, "--start", "--stop"])
    assert result.exit_code == 2
    assert "choose one of --start, --stop, --status, --show" in result.output
    assert daemon.calls == []


# ------------------------------------------------------------------------------ ddmd hprof


def _require_hprof_conv() -> None:
    if HPROF_CONV.exists():
        return
    skip_or_fail(f"needs {HPROF_CONV} (apt-get install hprof-conv)")


def test_hprof_writes_the_dump_and_prints_the_histogram(daemon):
    result = invoke(hprof, MAIL)
    assert result.exit_code == 0, result.output
    assert Path(HPROF_NAME).read_bytes() == daemon.hprof_bytes
    assert daemon.paths() == [
        f"GET /api/v1/vms/{MAIL}",
        "GET /api/v1/vms/tcp:8000/profiling",  # a refusal comes before "dumping..."
        "POST /api/v1/vms/tcp:8000/hprof",
        f"GET /api/v1/captures/{HPROF_NAME}",
    ]
    assert f"dumping the heap of {MAIL} (tcp:8000, pid 3101)" in result.stderr
    assert f"wrote {HPROF_NAME}" in result.stdout
    assert f"{HPROF_NAME}: JAVA PROFILE 1.0.3" in result.stdout
    # The sim's counts: 250 messages in the app heap.
    (row,) = [line for line in result.stdout.splitlines() if line.startswith(f"{MAIL}.Message ")]
    assert row.split()[1] == "250"
    assert "converted" not in result.stdout


def test_hprof_top_beyond_the_daemons_rows_reads_the_file(daemon):
    daemon.histogram_top = 3
    few = invoke(hprof, MAIL, "--top", "2")
    assert "top 2 by shallow bytes" in few.stdout
    every = invoke(hprof, MAIL, "--top", "0", "-o", "all.hprof")
    assert "all classes by shallow bytes" in every.stdout
    classes = summarise_file(Path("all.hprof")).classes
    assert all(entry.name in every.stdout for entry in classes)


def test_hprof_convert_with_the_real_hprof_conv(daemon, monkeypatch):
    _require_hprof_conv()
    monkeypatch.setenv("PATH", "/nonexistent")  # found where Debian's package puts it
    monkeypatch.delenv("ANDROID_HOME", raising=False)
    monkeypatch.delenv("ANDROID_SDK_ROOT", raising=False)
    result = invoke(hprof, MAIL, "--convert", "-o", "heap.hprof")
    assert result.exit_code == 0, result.output
    assert "converted for standard HPROF tools: heap-conv.hprof" in result.stdout
    android = summarise_file(Path("heap.hprof"))
    standard = summarise_file(Path("heap-conv.hprof"))
    assert standard.version == "JAVA PROFILE 1.0.2"
    assert standard.instance_counts()[f"{MAIL}.Message"] == 250
    assert android.instance_counts()[f"{MAIL}.Message"] == 250
    as_json = invoke(hprof, MAIL, "--convert", "--json", "-o", "again.hprof")
    body = json.loads(as_json.stdout)
    assert body["path"] == "again.hprof"
    assert body["converted"] == "again-conv.hprof"
    assert Path("again-conv.hprof").stat().st_size > 0


def _without_hprof_conv(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("ANDROID_HOME", raising=False)
    monkeypatch.delenv("ANDROID_SDK_ROOT", raising=False)
    monkeypatch.setattr(profiling, "DEBIAN_HPROF_CONV", tmp_path / "no" / "hprof-conv")


def test_hprof_convert_without_hprof_conv_says_how_to_get_it(daemon, monkeypatch, tmp_path):
    _without_hprof_conv(monkeypatch, tmp_path)
    result = invoke(hprof, MAIL, "--convert")
    assert result.exit_code == EXIT_API_ERROR
    assert "hprof-conv is not installed" in result.stderr
    assert "install the Debian package hprof-conv, or the Android SDK platform-tools" in (
        result.stderr
    )
    assert Path(HPROF_NAME).read_bytes() == daemon.hprof_bytes  # the dump is kept
    plain = invoke(hprof, MAIL, "-o", "plain.hprof")
    assert plain.exit_code == 0  # without --convert, hprof-conv is not needed


def test_hprof_conv_is_found_under_android_home(monkeypatch, tmp_path):
    _without_hprof_conv(monkeypatch, tmp_path)
    assert find_hprof_conv() is None
    tool = tmp_path / "sdk" / "platform-tools" / "hprof-conv"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    monkeypatch.setenv("ANDROID_HOME", str(tmp_path / "sdk"))
    assert find_hprof_conv() is None  # not executable
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    assert find_hprof_conv() == tool
    on_path = tmp_path / "bin" / "hprof-conv"
    on_path.parent.mkdir()
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert find_hprof_conv() == on_path


def test_converted_names():
    assert converted_name(Path("d/x.hprof")) == Path("d/x-conv.hprof")
    assert converted_name(Path("dump.bin")) == Path("dump.bin-conv.hprof")


def test_hprof_on_android_12_is_the_daemons_sentence(daemon):
    result = invoke(hprof, "maps")
    assert result.exit_code == EXIT_API_ERROR
    assert result.stderr.splitlines()[-1] == f"ddmd hprof: {NO_HPROF}"
    assert list(Path.cwd().iterdir()) == []


# ------------------------------------------------------------------------------ ddmd kill


@pytest.fixture
def terminal(monkeypatch) -> None:
    monkeypatch.setattr(profiling, "_can_ask", lambda: True)


def test_kill_with_yes(daemon):
    result = invoke(kill, MAIL, "--yes", "--status", "3")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"killed {MAIL} (tcp:8000, pid 3101) (exit status 3)\n"
    (query,) = [q for m, p, q in daemon.calls if p.endswith("/kill")]
    assert query == {"status": "3"}
    assert "tcp:8000" not in daemon.vms


def test_kill_without_a_terminal_needs_yes(daemon):
    result = invoke(kill, MAIL)
    assert result.exit_code == EXIT_CONFIG
    assert "pass --yes" in result.stderr
    assert not [p for p in daemon.paths() if p.endswith("/kill")]
    assert "tcp:8000" in daemon.vms


def test_kill_asks_on_a_terminal(daemon, terminal):
    declined = invoke(kill, MAIL, input="n\n")
    assert declined.exit_code == EXIT_API_ERROR
    assert f"Kill {MAIL} (pid 3101) on this computer? [y/N]" in declined.stderr
    assert "was not killed" in declined.stderr
    assert not [p for p in daemon.paths() if p.endswith("/kill")]
    by_default = invoke(kill, MAIL, input="\n")
    assert by_default.exit_code == EXIT_API_ERROR
    assert "tcp:8000" in daemon.vms
    accepted = invoke(kill, MAIL, "--json", input="y\n")
    assert accepted.exit_code == 0, accepted.output
    assert json.loads(accepted.stdout) == {"killed": "tcp:8000", "status": 1}
    (query,) = [q for m, p, q in daemon.calls if p.endswith("/kill")]
    assert query == {}  # no --status: the daemon's default
    assert "tcp:8000" not in daemon.vms


def test_kill_an_unknown_target_asks_nothing(daemon, terminal):
    result = invoke(kill, "nothing", input="y\n")
    assert result.exit_code == EXIT_TARGET
    assert "Kill" not in result.stderr
