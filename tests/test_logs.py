"""ddmd.logs: JSON and console output, stdlib routing, level filtering, the event catalogue."""

from __future__ import annotations

import io
import json
import logging
import re
from datetime import datetime

import pytest
import structlog
from structlog.testing import capture_logs

from ddmd import logs
from ddmd.logs import Event, configure, get_logger


@pytest.fixture(autouse=True)
def _reset_logging():
    yield
    logs.reset()


def json_lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_capture_logs_sees_events_and_context():
    log = get_logger("ddmd.test").bind(vm=3)
    with capture_logs() as captured:
        log.info(Event.VM_FOUND, pid=1234)
    assert captured == [{"event": "vm.found", "log_level": "info", "vm": 3, "pid": 1234}]


def test_capture_logs_after_configure():
    configure(stream=io.StringIO())
    with capture_logs() as captured:
        get_logger().warning(Event.DEBUGGER_SLOW_CONSUMER, debugger=2)
    assert captured[0]["event"] == "debugger.slow_consumer"
    assert captured[0]["log_level"] == "warning"


def test_json_lines_on_a_non_tty_stream():
    out = io.StringIO()
    configure(stream=out)  # fmt="auto", and a StringIO is not a terminal
    log = get_logger("ddmd.test")
    log.info(Event.VM_FOUND, vm=1, name="com.example")
    log.warning(Event.DEBUGGER_REJECTED, reason="busy")
    lines = json_lines(out)
    assert [line["event"] for line in lines] == ["vm.found", "debugger.rejected"]
    for line in lines:
        assert list(line)[:4] == ["ts", "level", "event", "logger"]
        assert line["ts"].endswith("Z")
        datetime.fromisoformat(line["ts"])
        assert line["logger"] == "ddmd.test"
    assert lines[0]["level"] == "info"
    assert lines[0]["vm"] == 1
    assert lines[0]["name"] == "com.example"
    assert lines[1]["level"] == "warning"


def test_fmt_json_forced():
    out = io.StringIO()
    configure(fmt="json", stream=out)
    get_logger().info(Event.DAEMON_STARTED)
    assert json_lines(out)[0]["event"] == "daemon.started"


def test_stdlib_logging_becomes_json_too():
    out = io.StringIO()
    configure(stream=out)
    logging.getLogger("hypercorn.error").warning("bind failed on %s", 8710)
    logging.getLogger("ddmd.stdlib").info("plain %d", 5, extra={"port": 8700})
    lines = json_lines(out)
    assert lines[0]["event"] == "bind failed on 8710"
    assert lines[0]["level"] == "warning"
    assert lines[0]["logger"] == "hypercorn.error"
    assert "ts" in lines[0]
    assert lines[1]["event"] == "plain 5"
    assert lines[1]["level"] == "info"


def test_exceptions_are_structured_without_locals():
    out = io.StringIO()
    configure(stream=out)
    secret = "token-123"  # a local that must not end up in the log
    try:
        raise ZeroDivisionError(secret[:0] + "division by zero")
    except ZeroDivisionError:
        get_logger().exception(Event.VM_CRASHED, vm=4)
    (line,) = json_lines(out)
    assert line["level"] == "error"
    assert line["exception"][0]["exc_type"] == "ZeroDivisionError"
    assert "token-123" not in out.getvalue()


def test_contextvars_are_merged():
    out = io.StringIO()
    configure(stream=out)
    with structlog.contextvars.bound_contextvars(vm=9, device="emulator-5554"):
        get_logger().info(Event.VM_CONNECTED)
        logging.getLogger("trio").warning("from trio")
    first, second = json_lines(out)
    assert (first["vm"], first["device"]) == (9, "emulator-5554")
    assert second["vm"] == 9


def test_level_filtering():
    out = io.StringIO()
    configure(level="warning", stream=out)
    log = get_logger("ddmd.test")
    log.debug("debug.hidden")
    log.info("info.hidden")
    log.warning("warning.shown")
    log.error("error.shown")
    logging.getLogger("ddmd.other").info("stdlib info hidden")
    logging.getLogger("ddmd.other").error("stdlib error shown")
    assert [line["event"] for line in json_lines(out)] == [
        "warning.shown",
        "error.shown",
        "stdlib error shown",
    ]


def test_noisy_libraries_quiet_unless_debug():
    out = io.StringIO()
    configure(level="info", stream=out)
    logging.getLogger("trio").info("trio chatter")
    logging.getLogger("hypercorn.access").info("GET /")
    get_logger().info("ours")
    assert [line["event"] for line in json_lines(out)] == ["ours"]

    out = io.StringIO()
    configure(level="debug", stream=out)
    logging.getLogger("trio").debug("trio chatter")
    get_logger().debug("ours")
    assert [line["event"] for line in json_lines(out)] == ["trio chatter", "ours"]


def test_console_format():
    out = io.StringIO()
    configure(fmt="console", stream=out)
    get_logger("ddmd.test").info(Event.VM_FOUND, vm=5)
    logging.getLogger("trio").warning("from trio")
    text = out.getvalue()
    lines = text.splitlines()
    assert len(lines) == 2
    assert "vm.found" in lines[0]
    assert "vm=5" in lines[0]
    assert "info" in lines[0]
    assert "from trio" in lines[1]
    assert "\x1b[" not in text  # no colours into a non-terminal
    with pytest.raises(json.JSONDecodeError):
        json.loads(lines[0])


def test_auto_picks_console_on_a_tty():
    class FakeTty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = FakeTty()
    configure(stream=out)
    get_logger().info(Event.DAEMON_STARTED)
    assert not out.getvalue().startswith("{")
    assert "daemon.started" in out.getvalue()


def test_reconfigure_replaces_the_handler():
    first, second = io.StringIO(), io.StringIO()
    configure(stream=first)
    configure(stream=second)
    get_logger().info(Event.DAEMON_STOPPED)
    logging.getLogger("ddmd.x").warning("stdlib")
    assert first.getvalue() == ""
    assert len(json_lines(second)) == 2


def test_structlog_settings():
    configure(stream=io.StringIO())
    config = structlog.get_config()
    assert config["processors"][0] is structlog.contextvars.merge_contextvars
    assert config["cache_logger_on_first_use"] is False


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"fmt": "xml"}, "format"), ({"level": "x"}, "level")]
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        configure(stream=io.StringIO(), **kwargs)


def test_level_names_are_case_insensitive():
    out = io.StringIO()
    configure(level="WARNING", stream=out)
    get_logger().info("hidden")
    assert out.getvalue() == ""


REQUIRED_EVENTS = [
    "daemon.started",
    "daemon.stopping",
    "daemon.stopped",
    "config.loaded",
    "config.defaults_used",
    "listener.non_loopback",
    "scan.probe_failed",
    "scan.backoff",
    "vm.found",
    "vm.connected",
    "vm.renamed",
    "vm.not_ddm",
    "vm.feature_unsupported",
    "vm.lost",
    "vm.crashed",
    "vm.reconnecting",
    "vm.reconnected",
    "ddm.chunk_unknown",
    "ddm.chunk_malformed",
    "ddm.reply_unknown",
    "ddm.request_timed_out",
    "debugger.attached",
    "debugger.detached",
    "debugger.rejected",
    "debugger.reply_dropped",
    "debugger.slow_consumer",
    "debugger.dispose",
    "current.changed",
    "heap.info",
    "heap.dump_problem",
    "threads.updated",
    "adb.connected",
    "adb.unavailable",
    "adb.lost",
    "device.online",
    "device.offline",
    "device.vm_found",
    "device.vm_gone",
    "control.request_failed",
]


def test_event_catalogue():
    values = [e.value for e in Event]
    assert len(values) == len(set(values))
    assert set(REQUIRED_EVENTS) <= set(values)
    for event in Event:
        assert re.fullmatch(r"[a-z]+\.[a-z_]+", event.value), event
        assert re.fullmatch(r"[A-Z]+(_[A-Z]+)*", event.name), event
        assert event == event.value  # a plain str to structlog


def test_event_renders_as_its_value():
    out = io.StringIO()
    configure(stream=out)
    get_logger().info(Event.CURRENT_CHANGED)
    assert '"event": "current.changed"' in out.getvalue()
