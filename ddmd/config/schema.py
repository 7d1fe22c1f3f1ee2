"""ddmd's configuration schema: the sections as frozen dataclasses, their defaults (as TOML
would write them), port ranges and host rules, and `SECTIONS`, the table of how each key of
each section is read.

Layer: standard library only; `config.section` reads one section by this table, and
`config.parse` a whole TOML document into a `Config` (the sections together). The public names
are importable as `ddmd.config.NAME`.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import Final, Literal, cast

__all__ = [
    "ADB_MODES",
    "DEFAULTS",
    "DEFAULT_ADB_PORT",
    "DEFAULT_FRONT_PORT",
    "FRONT_ON_KILL",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "SECTIONS",
    "AdbConfig",
    "AdbMode",
    "ControlConfig",
    "DebuggerConfig",
    "ExtensionsConfig",
    "FrontConfig",
    "FrontOnKill",
    "Given",
    "LimitsConfig",
    "LogConfig",
    "LogFormat",
    "LogLevel",
    "LogcatConfig",
    "MetricsConfig",
    "MonitorConfig",
    "PortRange",
    "Rule",
    "ScanConfig",
    "SectionSchema",
    "SecurityConfig",
    "TimeoutsConfig",
    "UnknownPeer",
    "ValueOf",
    "host_problem",
    "is_int",
    "is_loopback_host",
]

AdbMode = Literal["auto", "on", "off"]
LogFormat = Literal["auto", "json", "console"]
LogLevel = Literal["debug", "info", "warning", "error"]
UnknownPeer = Literal["allow", "refuse"]
FrontOnKill = Literal["refuse", "relay"]

ADB_MODES: Final = ("auto", "on", "off")
LOG_FORMATS: Final = ("auto", "json", "console")
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
UNKNOWN_PEER_MODES: Final = ("allow", "refuse")
FRONT_ON_KILL: Final = ("refuse", "relay")
SPECULATE_MODES: Final = ("auto", "on", "off")
#: The longest path a unix socket can have (sun_path holds 108 bytes with the final NUL).
MAX_SOCKET_PATH: Final = 107

#: Where adb's server listens unless ANDROID_ADB_SERVER_PORT says otherwise (adb's own rule).
DEFAULT_ADB_PORT: Final = 5037
#: Where ddmd's adb front listens (Android Studio's "user-managed adb" port default, too).
DEFAULT_FRONT_PORT: Final = 5038
#: A JDWP packet header is 11 bytes; its length field is an unsigned 32-bit number.
JDWP_HEADER_SIZE: Final = 11
JDWP_MAX_LENGTH: Final = 0xFFFF_FFFF

# The defaults, written as they would be in TOML, so they go through the same checks as a file does.
# config.example.toml repeats them (a test keeps the two equal). [adb] port is special: when the
# file does not set it, ANDROID_ADB_SERVER_PORT (if set) wins over the 5037 below.
DEFAULTS: Final[Mapping[str, Mapping[str, object]]] = MappingProxyType(
    {
        "scan": MappingProxyType(
            {
                "enabled": True,
                "host": "127.0.0.1",
                "ports": "8000-8040",
                "interval": 2.0,
                "backoff_max": 60.0,
            }
        ),
        "adb": MappingProxyType(
            {"enabled": "auto", "host": "127.0.0.1", "port": DEFAULT_ADB_PORT, "path": "adb"}
        ),
        "front": MappingProxyType(
            {
                "enabled": True,
                "host": "127.0.0.1",
                "port": DEFAULT_FRONT_PORT,
                "on_kill": "refuse",
                "open_timeout": 5.0,
                "request_timeout": 10.0,
            }
        ),
        "logcat": MappingProxyType(
            {"keep": False, "buffer_lines": 20_000, "idle_stop": 30.0, "stall_timeout": 10.0}
        ),
        "debugger": MappingProxyType(
            {
                "host": "127.0.0.1",
                "ports": "8600-8699",
                "current_port": 8700,
                "auto_select_waiting": True,
                "state_file": "",
                "queue_packets": 16384,
                "queue_bytes": 16 * 1024 * 1024,
                "pause_limit": 10.0,
                "relay_chunk_bytes": 1024 * 1024,
                "forget_after_days": 30,
                "max_per_vm": 4,
                "relay_threads": True,
                "relay_spin_us": 60,
                "speculate": "auto",
                "speculate_rtt_ms": 3,
                "speculate_max_inflight": 64,
                "speculate_max_bytes": 4 * 1024 * 1024,
            }
        ),
        "control": MappingProxyType(
            {"host": "127.0.0.1", "port": 8710, "token": "", "socket": "auto", "tcp": True}
        ),
        "monitor": MappingProxyType(
            {"thread_poll_interval": 0.5, "always_poll_threads": False, "heap_info": True}
        ),
        "timeouts": MappingProxyType(
            {
                "connect": 2.0,
                "handshake": 2.0,
                "ddm_request": 5.0,
                "jdwp_request": 30.0,
                "dbgd_ack": 1.0,
                "reconnect": 10.0,
                "adb": 5.0,
                "shutdown_grace": 5.0,
                "capture": 60.0,
            }
        ),
        "limits": MappingProxyType(
            {
                "max_packet_bytes": 1024 * 1024 * 1024,
                "max_inflated_bytes": 64 * 1024 * 1024,
                "max_vms": 256,
            }
        ),
        "log": MappingProxyType({"format": "auto", "level": "info"}),
        "security": MappingProxyType(
            {"allow_non_loopback": False, "allowed_uids": [], "unknown_peer": "allow"}
        ),
        "extensions": MappingProxyType({"disabled": []}),
        "metrics": MappingProxyType(
            {"host": "", "listen": False, "bind": "127.0.0.1", "port": 9464}
        ),
    }
)

# --------------------------------------------------------------------------------------------------
# Port ranges and hosts


MIN_PORT: Final = 1
MAX_PORT: Final = 65535
_RANGE_RE: Final = re.compile(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", re.ASCII)


def is_int(value: object) -> bool:
    # TOML booleans are Python bools, and bool is a subclass of int: `port = true` is not port 1.
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class PortRange:
    """An inclusive range of TCP ports, from "A-B" or a single port number."""

    start: int
    end: int

    def __post_init__(self) -> None:
        for port in (self.start, self.end):
            if not is_int(port):
                raise ValueError(f"port {port!r} is not an integer")
            if not MIN_PORT <= port <= MAX_PORT:
                raise ValueError(f"port {port} is outside {MIN_PORT}-{MAX_PORT}")
        if self.start > self.end:
            raise ValueError("start port is above end port")

    @classmethod
    def parse(cls, value: str | int) -> PortRange:
        """Read "8000-8040", "8000" or 8000. Raises ValueError saying what is wrong."""
        if is_int(value):
            port = cast("int", value)
            return cls(port, port)
        if not isinstance(value, str):
            raise ValueError("expected a port range 'START-END' or a port number")
        match = _RANGE_RE.fullmatch(value)
        if match is None:
            raise ValueError("expected a port range 'START-END' or a port number")
        start = int(match.group(1))
        end = int(match.group(2)) if match.group(2) is not None else start
        return cls(start, end)

    def __contains__(self, port: object) -> bool:
        return is_int(port) and self.start <= cast("int", port) <= self.end

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    def __len__(self) -> int:
        return self.end - self.start + 1

    def overlaps(self, other: PortRange) -> bool:
        return self.start <= other.end and other.start <= self.end

    def __str__(self) -> str:
        return str(self.start) if self.start == self.end else f"{self.start}-{self.end}"


_LABEL_RE: Final = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)", re.ASCII)


def host_problem(host: str) -> str | None:
    """None when `host` is an IP address or a valid host name, else what is wrong with it."""
    if host.startswith("[") and host.endswith("]"):
        return "write IPv6 addresses without brackets"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return None
    name = host.removesuffix(".")
    if not name or len(name) > 253:
        return "not an IP address or host name"
    labels = name.split(".")
    if not all(_LABEL_RE.fullmatch(label) for label in labels):
        return "not an IP address or host name"
    if all(label.isdigit() for label in labels):
        # "300.1.1.1" or "12345" would pass as names, but they are typos of addresses.
        return "not a valid IP address"
    return None


def is_loopback_host(host: str) -> bool:
    """True for 127.0.0.0/8, ::1, ::ffff:127.x and the names localhost and *.localhost."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        name = host.removesuffix(".").lower()
        return name == "localhost" or name.endswith(".localhost")
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


# --------------------------------------------------------------------------------------------------
# The dataclasses


@dataclass(frozen=True, slots=True)
class ScanConfig:
    """[scan]: probe local TCP ports for JDWP listeners (plain JVMs started with -agentlib:jdwp)."""

    enabled: bool
    host: str
    ports: PortRange
    interval: float
    backoff_max: float


@dataclass(frozen=True, slots=True)
class AdbConfig:
    """[adb]: find debuggable VMs on Android devices through an adb server."""

    enabled: AdbMode
    host: str
    port: int
    path: str


@dataclass(frozen=True, slots=True)
class FrontConfig:
    """[front]: ddmd's adb front, an adb server port of its own that relays every request to
    the real server ([adb] host/port) and serves ``jdwp:PID`` and JDWP forwards from the VM
    connections ddmd holds (``ddmd.front``). ``on_kill``: "refuse" answers ``host:kill`` with
    OKAY and keeps the real server; "relay" lets it die. ``open_timeout``: how long a
    ``jdwp:PID`` for a VM ddmd has not opened yet waits for it; ``request_timeout``: how long a
    client may take to send one whole request."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = DEFAULT_FRONT_PORT
    on_kill: FrontOnKill = "refuse"
    open_timeout: float = 5.0
    request_timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class LogcatConfig:
    """[logcat]: devices' logs (``ddmd.logcat``). One stream per device, opened when the first
    viewer arrives (or at once with ``keep``) and closed ``idle_stop`` seconds after the last
    leaves; ``buffer_lines`` entries are kept per device for ``--since`` and the web page; a
    stream stopped inside an entry for ``stall_timeout`` seconds is reopened."""

    keep: bool = False
    buffer_lines: int = 20_000
    idle_stop: float = 30.0
    stall_timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class DebuggerConfig:
    """[debugger]: where debuggers connect. `state_file` is already resolved to a path."""

    host: str
    ports: PortRange
    current_port: int
    auto_select_waiting: bool
    state_file: Path
    queue_packets: int
    relay_chunk_bytes: int
    forget_after_days: int  # ports.json entries of apps not seen for this long are dropped
    max_per_vm: int = 4  # debuggers attached to one VM at once (1: one debugger per VM)
    relay_threads: bool = True  # a VM with debuggers is relayed by a thread (drive/threadlane.py)
    relay_spin_us: int = 60  # how long that thread polls for a reply before it sleeps (0: never)
    speculate: str = "auto"  # foresight (session/foresight.py): auto, on or off
    speculate_rtt_ms: int = 3  # "auto" turns it on for a VM whose round trip is longer
    speculate_max_inflight: int = 64  # ddmd's own commands in flight per stop, at most
    speculate_max_bytes: int = 4 * 1024 * 1024  # replies held per VM, at most
    # A debugger that stops reading keeps its session while it has not read for at most
    # `pause_limit` seconds and at most `queue_bytes` (and `queue_packets`) wait for it.
    queue_bytes: int = 16 * 1024 * 1024
    pause_limit: float = 10.0


@dataclass(frozen=True, slots=True)
class ControlConfig:
    """[control]: the HTTP control API. An empty token means no token is required."""

    host: str
    port: int
    token: str
    # The unix socket the API also listens on ("auto" and "~" already resolved); None: none.
    socket: Path | None = None
    tcp: bool = True  # false: no TCP listener (the CLI uses the unix socket)


@dataclass(frozen=True, slots=True)
class MonitorConfig:
    """[monitor]: what ddmd asks DDM VMs for on its own."""

    thread_poll_interval: float
    always_poll_threads: bool
    heap_info: bool


@dataclass(frozen=True, slots=True)
class TimeoutsConfig:
    """[timeouts]: every network wait's deadline, in seconds (httpx Timeout shape)."""

    connect: float
    handshake: float
    ddm_request: float
    jdwp_request: float
    dbgd_ack: float
    reconnect: float
    adb: float
    shutdown_grace: float
    capture: float


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """[limits]: caps on sizes and counts."""

    max_packet_bytes: int
    max_inflated_bytes: int
    max_vms: int


@dataclass(frozen=True, slots=True)
class LogConfig:
    """[log]: output format and minimum level (the CLI's options override these)."""

    format: LogFormat
    level: LogLevel


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """[security]: allow_non_loopback must be true for a listening host that is not loopback;
    allowed_uids (user names already turned into uids) may connect besides ddmd's own uid and
    root; unknown_peer decides for a peer whose owner cannot be found (`ddmd.peers`)."""

    allow_non_loopback: bool
    allowed_uids: tuple[int, ...] = ()
    unknown_peer: UnknownPeer = "allow"


@dataclass(frozen=True, slots=True)
class ExtensionsConfig:
    """[extensions]: chunk-handler plugins (entry points ``ddmd.handlers``) not to load."""

    disabled: tuple[str, ...] = ()


#: The longest ``[metrics] host``: a DNS name's length.
MAX_METRICS_HOST: Final = 253


def this_host() -> str:
    """This machine's host name (``[metrics] host = ""``); "localhost" if it has none."""
    return socket.gethostname() or "localhost"


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """[metrics]: ``host`` is the ``host`` label of every series on ``/metrics`` (already
    resolved: "" in the file is this machine's host name). ``listen``: also serve ``/metrics``
    alone on ``bind``:``port`` (for a Prometheus on another machine, without opening the control
    API to it); ``bind`` follows [security] allow_non_loopback like every listening host."""

    host: str = field(default_factory=this_host)
    listen: bool = False
    bind: str = "127.0.0.1"
    port: int = 9464


# --------------------------------------------------------------------------------------------------
# The table: how each key of each section is read


class Given(Enum):
    """What a reader takes from outside its own key."""

    ENV = "env"  # the environment (ANDROID_ADB_SERVER_PORT, XDG_*, HOME, $NAME in paths)
    BASE_DIR = "base_dir"  # the config file's directory (relative paths), None for no file
    # [security] allow_non_loopback as read, None when that key has a problem of its own
    LOOPBACK_RULE = "loopback_rule"


@dataclass(frozen=True, slots=True)
class ValueOf:
    """The value of a key of the same section, read before this one."""

    key: str


@dataclass(frozen=True, slots=True)
class Rule:
    """How one key is read: the reader of `config.section.SectionReader` named ``reader`` is called
    with the key, ``args`` (each a plain value, a `Given` or a `ValueOf`) and ``options``."""

    reader: str
    args: tuple[object, ...] = ()
    options: Mapping[str, object] = field(default_factory=dict)


def rule(reader: str, *args: object, **options: object) -> Rule:
    return Rule(reader, args, MappingProxyType(options))


@dataclass(frozen=True, slots=True)
class SectionSchema:
    """One section: its dataclass and the rule of each key, in the order the keys are read."""

    cls: type
    keys: Mapping[str, Rule]


#: Every section, in the order they are read: [security] first (the hosts of [front],
#: [debugger] and [control] follow its allow_non_loopback). A key with a problem takes its
#: default, so the rest can still be checked.
SECTIONS: Final[Mapping[str, SectionSchema]] = MappingProxyType(
    {
        "security": SectionSchema(
            SecurityConfig,
            {
                "allow_non_loopback": rule("boolean"),
                "allowed_uids": rule("users"),
                "unknown_peer": rule("choice", UNKNOWN_PEER_MODES),
            },
        ),
        "scan": SectionSchema(
            ScanConfig,
            {
                "enabled": rule("boolean"),
                "host": rule("host"),
                "ports": rule("port_range"),
                "interval": rule("seconds"),
                "backoff_max": rule("seconds"),
            },
        ),
        "adb": SectionSchema(
            AdbConfig,
            {
                "enabled": rule("adb_mode"),
                "host": rule("host"),
                "port": rule("adb_port", Given.ENV),
                "path": rule("text", allow_empty=False),
            },
        ),
        "front": SectionSchema(
            FrontConfig,
            {
                "enabled": rule("boolean"),
                "host": rule("listen_host", Given.LOOPBACK_RULE),
                "port": rule("port"),
                "on_kill": rule("choice", FRONT_ON_KILL),
                "open_timeout": rule("seconds"),
                "request_timeout": rule("seconds"),
            },
        ),
        "logcat": SectionSchema(
            LogcatConfig,
            {
                "keep": rule("boolean"),
                "buffer_lines": rule("integer", minimum=100, maximum=10_000_000),
                "idle_stop": rule("seconds"),
                "stall_timeout": rule("seconds"),
            },
        ),
        "debugger": SectionSchema(
            DebuggerConfig,
            {
                "state_file": rule("state_file", Given.ENV, Given.BASE_DIR),
                "host": rule("listen_host", Given.LOOPBACK_RULE),
                "ports": rule("port_range"),
                "current_port": rule("port"),
                "auto_select_waiting": rule("boolean"),
                "queue_packets": rule("integer", minimum=1),
                "queue_bytes": rule("integer", minimum=65536),
                "pause_limit": rule("seconds"),
                "relay_chunk_bytes": rule("integer", minimum=4096),
                "forget_after_days": rule("integer", minimum=1),
                "max_per_vm": rule("integer", minimum=1, maximum=64),
                "relay_threads": rule("relay_threads"),
                "relay_spin_us": rule("integer", minimum=0, maximum=1000),
                "speculate": rule("choice", SPECULATE_MODES),
                "speculate_rtt_ms": rule("integer", minimum=0, maximum=60_000),
                "speculate_max_inflight": rule("integer", minimum=1, maximum=4096),
                "speculate_max_bytes": rule("integer", minimum=0),
            },
        ),
        "control": SectionSchema(
            ControlConfig,
            {
                "port": rule("port"),  # first: the "auto" socket's name holds it
                "host": rule("listen_host", Given.LOOPBACK_RULE),
                "token": rule("text"),
                "socket": rule("control_socket", ValueOf("port"), Given.ENV, Given.BASE_DIR),
                "tcp": rule("boolean"),
            },
        ),
        "monitor": SectionSchema(
            MonitorConfig,
            {
                "thread_poll_interval": rule("seconds"),
                "always_poll_threads": rule("boolean"),
                "heap_info": rule("boolean"),
            },
        ),
        "timeouts": SectionSchema(
            TimeoutsConfig, {key: rule("seconds") for key in DEFAULTS["timeouts"]}
        ),
        "limits": SectionSchema(
            LimitsConfig,
            {
                "max_packet_bytes": rule(
                    "integer", minimum=JDWP_HEADER_SIZE, maximum=JDWP_MAX_LENGTH
                ),
                "max_inflated_bytes": rule("integer", minimum=1),
                "max_vms": rule("integer", minimum=1),
            },
        ),
        "log": SectionSchema(
            LogConfig,
            {"format": rule("choice", LOG_FORMATS), "level": rule("choice", LOG_LEVELS)},
        ),
        "extensions": SectionSchema(ExtensionsConfig, {"disabled": rule("strings")}),
        "metrics": SectionSchema(
            MetricsConfig,
            {
                "host": rule("metrics_host"),
                "listen": rule("boolean"),
                "bind": rule("listen_host", Given.LOOPBACK_RULE),
                "port": rule("port"),
            },
        ),
    }
)
