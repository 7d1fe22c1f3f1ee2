"""Logging: the one structlog + stdlib `logging` set-up, and the catalogue of event names.

Layer: imported by everything above `protocol/` and `session/` for `get_logger` and `Event`;
`configure` is called once, by `cli`. Never imported by `ddmd.protocol` or `ddmd.session`.

Output goes to one stream (stdout unless told otherwise; systemd/journald keeps it):

- JSON lines when the stream is not a terminal or ``fmt="json"``: ``{"ts": "...Z", "level":
  "info", "event": "vm.found", "logger": "ddmd.discovery.scan", ...context}``, tracebacks as
  structured data (without local variables).
- structlog's ConsoleRenderer when the stream is a terminal or ``fmt="console"``.

Stdlib log records (trio, hypercorn, httpx, adbutils) go through
`structlog.stdlib.ProcessorFormatter`, so they come out in the same format. Event names are stable,
dotted `noun.past_tense` strings listed in `Event`; log them as ``log.info(Event.VM_FOUND, vm=...)``
and bind context once per actor. A fact that the event stream also carries has the same name in
both (``vm.found``, ``vm.gone``, ``vm.renamed``, ``debugger.attached``, ...).

A VM's identity: every line with a ``vm`` key (logged with ``vm=`` or bound with structlog's
``bound_contextvars``) also carries that VM's ``app`` and ``pid`` once they are known
(`add_vm_identity`, fed by the VM's actor through `bind_vm_identity`: at once, and again when
the VM is named or renamed). The identity is looked up at log time, by the VM id, rather than
bound as context variables: trio gives every task a copy of the context as it was when the task
started, so a name learned later would never reach the VM's timer, its debuggers' tasks or the
API requests that log about it. `CONTEXT_PROCESSORS` are the two processors that add context;
tests that capture logs use them too.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from enum import StrEnum, unique
from types import MappingProxyType
from typing import Any, Final, TextIO, cast

import structlog
import structlog.tracebacks
from structlog.typing import EventDict, FilteringBoundLogger, Processor, WrappedLogger

__all__ = [
    "CONTEXT_PROCESSORS",
    "FORMATS",
    "LEVELS",
    "Event",
    "add_vm_identity",
    "bind_vm_identity",
    "configure",
    "get_logger",
    "reset",
    "unbind_vm_identity",
]

LEVELS: Final[Mapping[str, int]] = MappingProxyType(
    {
        "debug": logging.DEBUG,
        "info": logging.INFO,
        "warning": logging.WARNING,
        "error": logging.ERROR,
    }
)
FORMATS: Final = ("auto", "json", "console")

# Third-party loggers that chatter at INFO/DEBUG; held at WARNING unless the level is debug.
_NOISY_LOGGERS: Final = (
    "adbutils",
    "asyncio",
    "h11",
    "h2",
    "hpack",
    "httpcore",
    "httpx",
    "hypercorn",
    "hypercorn.access",
    "hypercorn.error",
    "requests",
    "trio",
    "urllib3",
)

# The keys every JSON line starts with, in this order (the VM's identity when present); the
# rest of the context follows.
_LEADING_KEYS: Final = ("ts", "level", "event", "logger", "vm", "app", "pid")


@unique
class Event(StrEnum):
    """Every event name the daemon logs. A str, so ``log.info(Event.VM_FOUND)`` logs "vm.found"."""

    # daemon lifecycle and configuration
    DAEMON_STARTED = "daemon.started"
    DAEMON_STOPPING = "daemon.stopping"
    DAEMON_STOPPED = "daemon.stopped"
    DAEMON_SIGNAL = "daemon.signal_received"
    DAEMON_NOTIFY_FAILED = "daemon.notify_failed"
    CONFIG_LOADED = "config.loaded"
    CONFIG_DEFAULTS_USED = "config.defaults_used"
    # chunk-handler plugins (ddmd.ext)
    VM_KILL_REQUESTED = "vm.kill_requested"
    EXT_LOADED = "ext.loaded"
    EXT_LOAD_FAILED = "ext.load_failed"
    EXT_HANDLER_FAILED = "ext.handler_failed"
    EXT_HANDLER_DISABLED = "ext.handler_disabled"
    # listening ports
    LISTENER_NON_LOOPBACK = "listener.non_loopback"
    LISTENER_ACCEPT_FAILED = "listener.accept_failed"
    # who may connect (ddmd.peers)
    SECURITY_PEER_REFUSED = "security.peer_refused"
    SECURITY_PEER_GONE = "security.peer_gone"  # closed before its check: refused, not news
    SECURITY_UIDS_UNCHECKED = "security.uids_unchecked"
    # discovery by port scan
    SCAN_PROBE_FAILED = "scan.probe_failed"
    SCAN_BACKOFF = "scan.backoff"
    SCAN_PORT_NOT_JDWP = "scan.port_not_jdwp"
    SCAN_PORT_RECOVERED = "scan.port_recovered"
    SCAN_FOREIGN_VM_SKIPPED = "scan.foreign_vm_skipped"
    # one VM's life
    VM_FOUND = "vm.found"
    VM_GONE = "vm.gone"  # its actor ended (reason): the last line about that VM
    VM_REJECTED = "vm.rejected"
    VM_CONNECTED = "vm.connected"
    VM_HELLO = "vm.hello"
    VM_HELLO_FAILED = "vm.hello_failed"
    VM_VERSION = "vm.version"
    VM_PID_MISMATCH = "vm.pid_mismatch"
    VM_RENAMED = "vm.renamed"  # app/package changed (APNM), as on the event stream
    VM_WAITING_FOR_DEBUGGER = "vm.waiting_for_debugger"
    VM_NOT_DDM = "vm.not_ddm"
    VM_FEATURE_UNSUPPORTED = "vm.feature_unsupported"
    VM_EVENT_DROPPED = "vm.event_dropped"
    VM_PROTOCOL_ERROR = "vm.protocol_error"
    VM_DISCONNECTED = "vm.disconnected"
    VM_LOST = "vm.lost"
    VM_CRASHED = "vm.crashed"
    VM_RECONNECTING = "vm.reconnecting"
    VM_RECONNECTED = "vm.reconnected"
    VM_RELEASED = "vm.released"  # the last debugger left and the VM is free again (how, after)
    # A plain JVM's release on its kept connection was refused or unanswered (why): reconnecting.
    VM_RELEASE_UNCONFIRMED = "vm.release_unconfirmed"
    # protocol trouble
    DDM_CHUNK_UNKNOWN = "ddm.chunk_unknown"
    DDM_CHUNK_MALFORMED = "ddm.chunk_malformed"
    DDM_REPLY_UNKNOWN = "ddm.reply_unknown"
    DEBUGGER_REPLIES_ABANDONED = "debugger.replies_abandoned"
    DDM_REQUEST_TIMED_OUT = "ddm.request_timed_out"
    DDM_PUSH_IGNORED = "ddm.push_ignored"
    STREAM_CLOSE_FAILED = "stream.close_failed"
    # debuggers
    DEBUGGER_LISTENING = "debugger.listening"
    DEBUGGER_PORT_SKIPPED = "debugger.port_skipped"
    DEBUGGER_ATTACHED = "debugger.attached"
    DEBUGGER_PROTOCOL_ERROR = "debugger.protocol_error"
    DEBUGGER_DETACHED = "debugger.detached"
    DEBUGGER_REJECTED = "debugger.rejected"
    DEBUGGER_HANDSHAKE_FAILED = "debugger.handshake_failed"
    DEBUGGER_HANDSHAKE_TIMED_OUT = "debugger.handshake_timed_out"
    DEBUGGER_REPLY_DROPPED = "debugger.reply_dropped"
    DEBUGGER_SLOW_CONSUMER = "debugger.slow_consumer"
    DEBUGGER_DISPOSE = "debugger.dispose"
    # the current-VM port
    CURRENT_CHANGED = "current.changed"
    DDM_DBGD_SENT = "ddm.dbgd_sent"
    DDM_DBGD_ACKNOWLEDGED = "ddm.dbgd_acknowledged"
    DDM_PUSH_DISCARDED = "ddm.push_discarded"
    VM_RECONNECT_FAILED = "vm.reconnect_failed"
    VM_START_HELD = "vm.start_held"
    VM_SEND_FAILED = "vm.send_failed"
    # several debuggers on one VM
    VM_EXIT_REQUESTED = "vm.exit_requested"  # a debugger's VirtualMachine.Exit, and who sent it
    VM_EVENT_UNSPLIT = "vm.event_unsplit"  # an event packet given whole to every debugger
    VM_SUSPENSION_UNTRACKED = "vm.suspension_untracked"
    VM_COMMAND_REFUSED = "vm.command_refused"  # a command ddmd sent for a debugger's rules
    DEBUGGER_RELEASED = "debugger.released"  # what a departing debugger's leaving released
    DEBUGGER_HOLD_OVERFLOWED = "debugger.hold_overflowed"
    # foresight: how many of a departing debugger's commands ddmd answered, and about how much
    # time that saved it (answered x the measured round trip)
    DEBUGGER_FORESIGHT = "debugger.foresight"
    PORTS_STATE_PROBLEM = "ports.state_problem"
    PORTS_FORGOTTEN = "ports.forgotten"  # an app's remembered debugger port was dropped
    # monitoring
    HEAP_INFO = "heap.info"
    HEAP_DUMP_PROBLEM = "heap.dump_problem"
    THREADS_UPDATED = "threads.updated"
    # adb and Android devices
    ADB_CONNECTED = "adb.connected"
    ADB_UNAVAILABLE = "adb.unavailable"
    ADB_LOST = "adb.lost"
    ADB_SERVER_STARTING = "adb.server_starting"
    ADB_PROTOCOL_ERROR = "adb.protocol_error"
    DEVICE_ONLINE = "device.online"
    DEVICE_OFFLINE = "device.offline"
    DEVICE_TRACK_FAILED = "device.track_failed"
    DEVICE_VM_FOUND = "device.vm_found"
    DEVICE_VM_OPEN_FAILED = "device.vm_open_failed"
    DEVICE_VM_GONE = "device.vm_gone"
    # the adb front (ddmd.front): an adb server port of ddmd's own
    FRONT_LISTENING = "front.listening"
    FRONT_PORT_IN_USE = "front.port_in_use"  # the front is off; ddmd runs on without it
    FRONT_DISABLED = "front.disabled"  # a setting keeps the front from running
    FRONT_BAD_REQUEST = "front.bad_request"  # a length adb's server refuses too
    FRONT_REQUEST_TIMED_OUT = "front.request_timed_out"
    FRONT_KILL_REFUSED = "front.kill_refused"  # adb kill-server answered, the server kept
    FRONT_KILL_RELAYED = "front.kill_relayed"
    FRONT_JDWP_SERVED = "front.jdwp_served"  # jdwp:PID handed to ddmd's VM connection
    FRONT_JDWP_RELAYED = "front.jdwp_relayed"  # ddmd does not hold that VM: the server serves it
    FRONT_FORWARD_ADDED = "front.forward_added"
    FRONT_FORWARD_REMOVED = "front.forward_removed"
    FRONT_FORWARD_CONNECTED = "front.forward_connected"
    FRONT_FORWARD_REFUSED = "front.forward_refused"  # its VM is gone: the connection is closed
    FRONT_UPSTREAM_UNAVAILABLE = "front.upstream_unavailable"
    FRONT_SERVER_STOPPED = "front.server_stopped"  # the adb server the front started, at exit
    FRONT_CLIENT_FAILED = "front.client_failed"  # a bug met serving one client: it is closed
    # devices' logs (ddmd.logcat)
    APP_CRASHED = "app.crashed"  # a Java crash, a native crash (tombstone) or an ANR
    LOGCAT_STREAM_PROBLEM = "logcat.stream_problem"  # broke, stalled, malformed: reopened
    LOGCAT_VIEWER_LAGGED = "logcat.viewer_lagged"  # a viewer too slow lost lines (at its end)
    # control API
    CONTROL_LISTENING = "control.listening"
    METRICS_LISTENING = "metrics.listening"  # [metrics] listen: /metrics alone on its own port
    CONTROL_REQUEST_FAILED = "control.request_failed"
    CONTROL_REQUEST_REFUSED = "control.request_refused"
    CONTROL_SOCKET_STALE = "control.socket_stale_removed"


# vm id -> {"app": ..., "pid": ...}: the identity of every VM an actor serves now.
_VM_IDENTITIES: dict[str, dict[str, Any]] = {}


def bind_vm_identity(vm: str, app: str | None, pid: int | None) -> None:
    """From now on every log line with ``vm=vm`` carries ``app`` and ``pid`` (the known ones).

    Called by the VM's actor as soon as they are known and whenever they change (a rename)."""
    known = {k: v for k, v in (("app", app), ("pid", pid)) if v is not None}
    if known:
        _VM_IDENTITIES[vm] = known
    else:
        _VM_IDENTITIES.pop(vm, None)


def unbind_vm_identity(vm: str) -> None:
    """The VM is gone (after its last line, ``vm.gone``)."""
    _VM_IDENTITIES.pop(vm, None)


def add_vm_identity(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """The processor: ``app`` and ``pid`` of the line's ``vm``; keys given explicitly win."""
    vm = event_dict.get("vm")
    if isinstance(vm, str):
        identity = _VM_IDENTITIES.get(vm)
        if identity:
            for key, value in identity.items():
                event_dict.setdefault(key, value)
    return event_dict


#: The processors that add context to an event: bound context variables (``vm``), then the
#: VM's identity. ``configure`` runs them first; log-capturing tests should run them too.
CONTEXT_PROCESSORS: Final[tuple[Processor, ...]] = (
    structlog.contextvars.merge_contextvars,
    add_vm_identity,
)


def get_logger(name: str | None = None, **initial_values: Any) -> FilteringBoundLogger:
    """A structlog logger, configured at first use; `name` names its stdlib logger."""
    if name is None:
        return cast("FilteringBoundLogger", structlog.get_logger(**initial_values))
    return cast("FilteringBoundLogger", structlog.get_logger(name, **initial_values))


class _DdmdHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The root handler `configure` installs; its own class so that reconfiguring can replace it."""


def _lead_keys(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Put ts, level, event, logger first so JSON lines read the same way every time."""
    ordered = {key: event_dict.pop(key) for key in _LEADING_KEYS if key in event_dict}
    ordered.update(event_dict)
    return ordered


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def configure(*, fmt: str = "auto", level: str = "info", stream: TextIO | None = None) -> None:
    """Set up structlog and stdlib logging; call once per process (tests may call it again).

    `fmt` is "auto" (console on a terminal, else JSON), "json" or "console"; `level` is one of
    `LEVELS`; `stream` defaults to sys.stdout as it is now.
    """
    level_name = level.lower()
    if level_name not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {', '.join(FORMATS)}")
    level_no = LEVELS[level_name]
    out = sys.stdout if stream is None else stream
    tty = _is_tty(out)
    console = fmt == "console" or (fmt == "auto" and tty)

    # Applied to every event: to structlog's before it becomes a LogRecord, to stdlib records in the
    # formatter (foreign_pre_chain).
    shared: list[Processor] = [
        *CONTEXT_PROCESSORS,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
    ]
    renderer: list[Processor]
    if console:
        renderer = [structlog.dev.ConsoleRenderer(colors=tty, timestamp_key="ts")]
    else:
        renderer = [
            # dict_tracebacks without locals: they bloat every line and may hold secrets.
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            ),
            _lead_keys,
            structlog.processors.JSONRenderer(),
        ]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
    )
    handler = _DdmdHandler(out)
    handler.setFormatter(formatter)

    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _DdmdHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level_no)
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(
            logging.NOTSET if level_no <= logging.DEBUG else logging.WARNING
        )

    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.stdlib.LoggerFactory(),
        context_class=dict,
        cache_logger_on_first_use=False,
    )


def reset() -> None:
    """Undo `configure`: structlog's defaults, no ddmd handler on the root logger, no VM
    identities. For tests."""
    structlog.reset_defaults()
    _VM_IDENTITIES.clear()
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _DdmdHandler)]:
        root.removeHandler(old)
    root.setLevel(logging.WARNING)
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
