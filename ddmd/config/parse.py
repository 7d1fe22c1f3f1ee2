"""ddmd's configuration read from TOML: a file read with `tomllib`, every key checked, into the
frozen dataclasses of `config.schema`.

Layer: imports only the standard library, `config.schema` and `ddmd.errors`; used (through
`ddmd.config`) by `daemon`, `cli` and the modules that take a `Config`.
No environment reads at import, no logging, no sockets: the environment is read only inside
`load_config`/`parse_config`/`Config.default`/`find_config_file`, through an `env` mapping that
tests can replace.

Every problem is a `ConfigError` naming the file, the key and the value. A document is checked
whole: a key with a problem takes its default so that the rest can still be checked (checks
across keys skip keys that already have a problem, so one mistake is reported once), and
several problems come as one `ConfigProblems` listing them all. `config.example.toml` at the
repository root documents every key with its default; it loads to exactly `Config.default()`.
"""

from __future__ import annotations

import difflib
import math
import os
import pwd
import string
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from datetime import date, datetime, time
from pathlib import Path
from typing import Any, TypeVar, cast

from ddmd.config.schema import (
    ADB_MODES,
    DEFAULT_ADB_PORT,
    DEFAULTS,
    FRONT_ON_KILL,
    JDWP_HEADER_SIZE,
    JDWP_MAX_LENGTH,
    LOG_FORMATS,
    LOG_LEVELS,
    MAX_PORT,
    MAX_SOCKET_PATH,
    MIN_PORT,
    UNKNOWN_PEER_MODES,
    AdbConfig,
    AdbMode,
    Config,
    ControlConfig,
    DebuggerConfig,
    ExtensionsConfig,
    FrontConfig,
    FrontOnKill,
    LimitsConfig,
    LogcatConfig,
    LogConfig,
    LogFormat,
    LogLevel,
    MonitorConfig,
    PortRange,
    ScanConfig,
    SecurityConfig,
    TimeoutsConfig,
    UnknownPeer,
    host_problem,
    is_int,
    is_loopback_host,
)
from ddmd.errors import ConfigError, ConfigProblems, format_key

__all__ = ["find_config_file", "load_config", "parse_config"]


# --------------------------------------------------------------------------------------------------
# Reading values


def _toml_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, datetime):
        return "a date-time"
    if isinstance(value, date):
        return "a date"
    if isinstance(value, time):
        return "a time"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "a table"
    return type(value).__name__


def _suggest(name: str, allowed: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


_T = TypeVar("_T")

#: The largest user id (uid_t is 32 bits; 2**32-1 means "no user").
MAX_UID = 2**32 - 2


class _Section:
    """One [section] of the file, with its defaults, turned into checked Python values.

    The readers (`boolean`, `port`, ...) raise ConfigError; `get` calls one, and on a problem
    records it in `problems` and answers the default instead, so checking goes on.
    """

    def __init__(
        self, name: str, table: Mapping[str, object], source: str, problems: list[ConfigError]
    ) -> None:
        self.name = name
        self.table = table
        self.source = source
        self.defaults = DEFAULTS[name]
        self.problems = problems
        self._failed: set[str] = set()

    def check_unknown_keys(self) -> None:
        allowed = tuple(self.defaults)
        for key, value in self.table.items():
            if key not in self.defaults:
                hint = _suggest(key, allowed)
                listed = ", ".join(allowed)
                self.report(
                    self.error(key, f"unknown key; {hint}keys in [{self.name}]: {listed}", value)
                )

    def report(self, problem: ConfigError) -> None:
        self.problems.append(problem)

    def get(self, read: Callable[..., _T], key: str, *args: Any, **kwargs: Any) -> _T:
        """``read(key, ...)``; on a problem, record it and read the default instead."""
        try:
            return read(key, *args, **kwargs)
        except ConfigError as problem:
            self.report(problem)
            self._failed.add(key)
            return read(key, *args, **kwargs)

    def failed(self, *keys: str) -> bool:
        """True if any of `keys` had a problem (and so holds its default now)."""
        return any(key in self._failed for key in keys)

    def is_set(self, key: str) -> bool:
        return key in self.table

    def raw(self, key: str) -> object:
        if key in self.table and key not in self._failed:
            return self.table[key]
        return self.defaults[key]

    def error(self, key: str, message: str, value: object) -> ConfigError:
        return ConfigError(message, path=self.source, key=f"{self.name}.{key}", value=value)

    def boolean(self, key: str) -> bool:
        value = self.raw(key)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {_toml_type(value)}", value)
        return value

    def text(self, key: str, *, allow_empty: bool = True) -> str:
        value = self.raw(key)
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {_toml_type(value)}", value)
        if not allow_empty and not value:
            raise self.error(key, "must not be empty", value)
        if "\x00" in value:
            raise self.error(key, "must not contain a NUL character", value)
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        """A list of non-empty strings (``disabled = ["a", "b"]``)."""
        value = self.raw(key)
        if not isinstance(value, list):
            raise self.error(key, f"expected a list of strings, got {_toml_type(value)}", value)
        for item in value:
            if not isinstance(item, str) or not item or "\x00" in item:
                raise self.error(
                    key, f"expected a list of non-empty strings; {item!r} is not one", value
                )
        return tuple(value)

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        value = self.raw(key)
        allowed = ", ".join(repr(c) for c in choices)
        if not isinstance(value, str):
            raise self.error(key, f"expected one of {allowed}, got {_toml_type(value)}", value)
        if value.lower() not in choices:
            raise self.error(key, f"must be one of {allowed}", value)
        return value.lower()

    def integer(self, key: str, *, minimum: int, maximum: int | None = None) -> int:
        value = self.raw(key)
        if not is_int(value):
            raise self.error(key, f"expected an integer, got {_toml_type(value)}", value)
        number = cast("int", value)
        if number < minimum or (maximum is not None and number > maximum):
            bounds = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
            raise self.error(key, f"must be {bounds}", value)
        return number

    def seconds(self, key: str) -> float:
        value = self.raw(key)
        if not (is_int(value) or isinstance(value, float)):
            raise self.error(key, f"expected a number of seconds, got {_toml_type(value)}", value)
        try:
            number = float(cast("float", value))
        except OverflowError:
            number = math.inf
        if not (math.isfinite(number) and number > 0):
            raise self.error(key, "must be a positive, finite number of seconds", value)
        return number

    def port(self, key: str) -> int:
        value = self.raw(key)
        if not is_int(value):
            raise self.error(key, f"expected a port number, got {_toml_type(value)}", value)
        if not MIN_PORT <= cast("int", value) <= MAX_PORT:
            raise self.error(key, f"port must be between {MIN_PORT} and {MAX_PORT}", value)
        return cast("int", value)

    def port_range(self, key: str) -> PortRange:
        value = self.raw(key)
        if not (is_int(value) or isinstance(value, str)):
            raise self.error(
                key, f"expected 'START-END' or a port number, got {_toml_type(value)}", value
            )
        try:
            return PortRange.parse(cast("str | int", value))
        except ValueError as exc:
            raise self.error(key, str(exc), value) from None

    def users(self, key: str) -> tuple[int, ...]:
        """A list of uids (integers) and user names (strings, looked up in the user database
        now, so a name that does not exist is reported here rather than ignored later)."""
        value = self.raw(key)
        if not isinstance(value, list):
            raise self.error(
                key, f"expected a list of user ids or user names, got {_toml_type(value)}", value
            )
        uids: list[int] = []
        for item in value:
            if is_int(item):
                if not 0 <= item <= MAX_UID:
                    raise self.error(key, f"user id {item} is outside 0-{MAX_UID}", value)
                uids.append(item)
            elif isinstance(item, str) and item and "\x00" not in item:
                try:
                    uids.append(pwd.getpwnam(item).pw_uid)
                except KeyError:
                    problem = f"no user named {item!r} on this system (give a user id instead)"
                    raise self.error(key, problem, value) from None
            else:
                raise self.error(
                    key, f"expected user ids or user names; {item!r} is neither", value
                )
        return tuple(dict.fromkeys(uids))

    def control_socket(
        self, key: str, port: int, env: Mapping[str, str], base_dir: Path | None
    ) -> Path | None:
        """The unix socket's path: "auto" is `runtime_dir`/control-PORT.sock, "" none (None),
        anything else a path as `path` reads it ($NAME expanded, "~/" the home directory, a
        relative path taken relative to the config file's directory)."""
        raw = self.text(key)
        if raw == "auto":
            path = runtime_dir(env) / f"control-{port}.sock"
        else:
            given = self.path(key, env, base_dir)
            if given is None:
                return None
            path = Path(os.path.abspath(given))
        length = len(os.fsencode(path))
        if length > MAX_SOCKET_PATH:
            # Name the path when the user did not write it out ("auto", $NAME, a relative one).
            where = f" ({path})" if str(path) != raw else ""
            raise self.error(
                key,
                f"the socket path{where} is {length} bytes long; a unix socket path has at most "
                f"{MAX_SOCKET_PATH}: choose a shorter one",
                raw,
            )
        return path

    def path(self, key: str, env: Mapping[str, str], base_dir: Path | None) -> Path | None:
        """A file path, or None for "": ``$NAME`` and ``${NAME}`` are taken from the environment
        (``$$`` is a "$"), a leading "~/" is the home directory, and a relative path is taken
        relative to the config file's directory."""
        raw = self.text(key)
        if raw == "":
            return None
        try:
            expanded = _expand_variables(raw, env)
        except ValueError as exc:
            raise self.error(key, str(exc), raw) from None
        return _resolve_path(expanded, env, base_dir)

    def host(self, key: str) -> str:
        value = self.text(key, allow_empty=False)
        problem = host_problem(value)
        if problem is not None:
            raise self.error(key, problem, value)
        return value

    def listen_host(self, key: str, allow_non_loopback: bool | None) -> str:
        """A host to listen on; None for `allow_non_loopback` (that key has a problem of its
        own) skips the loopback rule rather than report a second problem."""
        value = self.host(key)
        if allow_non_loopback is False and not is_loopback_host(value):
            raise self.error(
                key,
                "not a loopback address: other machines could connect to it; set [security] "
                "allow_non_loopback = true to allow this",
                value,
            )
        return value


# --------------------------------------------------------------------------------------------------
# Env-dependent values


def _home(env: Mapping[str, str]) -> Path:
    home = env.get("HOME", "")
    return Path(home) if home else Path.home()


def _default_state_file(env: Mapping[str, str]) -> Path:
    xdg = env.get("XDG_STATE_HOME", "")
    # The XDG spec says relative values are invalid and must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else _home(env) / ".local" / "state"
    return base / "ddmd" / "ports.json"


def _expand_variables(raw: str, env: Mapping[str, str]) -> str:
    """`raw` with ``$NAME``/``${NAME}`` replaced from `env`; ValueError naming the fix for an
    unset (or empty) variable or a stray "$"."""
    template = string.Template(raw)
    if not template.is_valid():
        raise ValueError(
            'a "$" must start a variable, $NAME or ${NAME}; write $$ for a "$" in the path'
        )
    known = {name: value for name, value in env.items() if value}
    missing = [name for name in template.get_identifiers() if name not in known]
    if missing:
        name = missing[0]
        raise ValueError(
            f"${name} is not set in ddmd's environment: set it where ddmd starts, or write "
            f"the path without it"
        )
    return template.substitute(known)


def _resolve_path(raw: str, env: Mapping[str, str], base_dir: Path | None) -> Path:
    if raw == "~" or raw.startswith("~/"):
        return _home(env) / raw[2:]
    path = Path(raw).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return path


def runtime_dir(env: Mapping[str, str]) -> Path:
    """ddmd's directory for its lock files and control socket: ``$XDG_RUNTIME_DIR/ddmd``, or
    ``/tmp/ddmd-UID`` when the variable is unset or relative (the XDG spec says to ignore a
    relative value)."""
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime):
        return Path(runtime) / "ddmd"
    return Path(tempfile.gettempdir()) / f"ddmd-{os.getuid()}"


def _adb_port(section: _Section, env: Mapping[str, str]) -> int:
    if section.is_set("port"):
        return section.get(section.port, "port")
    raw = env.get("ANDROID_ADB_SERVER_PORT", "")
    if not raw:
        return section.get(section.port, "port")
    port = int(raw) if raw.isascii() and raw.isdigit() else -1
    if not MIN_PORT <= port <= MAX_PORT:
        section.report(
            section.error(
                "port",
                "the default comes from the environment variable ANDROID_ADB_SERVER_PORT, "
                "which is not a port number; fix the variable or set [adb] port",
                raw,
            )
        )
        return DEFAULT_ADB_PORT
    return port


# --------------------------------------------------------------------------------------------------
# Parsing


def parse_config(
    data: Mapping[str, Any],
    *,
    source: str,
    env: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
) -> Config:
    """Check a parsed TOML document and build a Config; missing keys take their defaults.

    `source` names the file in errors. `env` (default: os.environ, read now) supplies
    ANDROID_ADB_SERVER_PORT, XDG_STATE_HOME and HOME. A relative [debugger] state_file is taken
    relative to `base_dir` (the config file's directory) when given.
    """
    if env is None:
        env = os.environ
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a table at the top level, got {_toml_type(data)}", path=source)

    problems: list[ConfigError] = []
    sections = tuple(DEFAULTS)
    tables: dict[str, Mapping[str, object]] = {}
    for name, table in data.items():
        if name in DEFAULTS:
            if isinstance(table, Mapping):
                tables[name] = table
            else:
                problems.append(
                    ConfigError(
                        f"expected a [{name}] table, got {_toml_type(table)}",
                        path=source,
                        key=name,
                        value=table,
                    )
                )
            continue
        holders = [s for s in sections if name in DEFAULTS[s]]
        if holders and not isinstance(table, Mapping):
            hint = " or ".join(format_key(f"{s}.{name}") for s in holders)
            message = f"keys belong in a section; did you mean {hint}?"
        else:
            message = f"unknown section; {_suggest(name, sections)}sections: {', '.join(sections)}"
        problems.append(
            ConfigError(
                message,
                path=source,
                key=name,
                value=None if isinstance(table, Mapping) else table,
            )
        )

    sec = {name: _Section(name, tables.get(name, {}), source, problems) for name in sections}
    for section in sec.values():
        section.check_unknown_keys()

    sc = sec["security"]
    security = SecurityConfig(
        allow_non_loopback=sc.get(sc.boolean, "allow_non_loopback"),
        allowed_uids=sc.get(sc.users, "allowed_uids"),
        unknown_peer=cast("UnknownPeer", sc.get(sc.choice, "unknown_peer", UNKNOWN_PEER_MODES)),
    )
    # Unknown when that key itself is wrong: then the loopback rule is not applied at all.
    allow_non_loopback = None if sc.failed("allow_non_loopback") else security.allow_non_loopback

    s = sec["scan"]
    scan = ScanConfig(
        enabled=s.get(s.boolean, "enabled"),
        host=s.get(s.host, "host"),
        ports=s.get(s.port_range, "ports"),
        interval=s.get(s.seconds, "interval"),
        backoff_max=s.get(s.seconds, "backoff_max"),
    )
    if not s.failed("interval", "backoff_max") and scan.backoff_max < scan.interval:
        s.report(
            s.error(
                "backoff_max",
                f"must not be below [scan] interval ({scan.interval:g} s)",
                s.raw("backoff_max"),
            )
        )

    a = sec["adb"]
    enabled_raw = a.raw("enabled")
    # `enabled = true/false` reads naturally in TOML; take it as "on"/"off".
    if isinstance(enabled_raw, bool):
        adb_mode: AdbMode = "on" if enabled_raw else "off"
    else:
        adb_mode = cast("AdbMode", a.get(a.choice, "enabled", ADB_MODES))
    adb = AdbConfig(
        enabled=adb_mode,
        host=a.get(a.host, "host"),
        port=_adb_port(a, env),
        path=a.get(a.text, "path", allow_empty=False),
    )

    fr = sec["front"]
    front = FrontConfig(
        enabled=fr.get(fr.boolean, "enabled"),
        host=fr.get(fr.listen_host, "host", allow_non_loopback),
        port=fr.get(fr.port, "port"),
        on_kill=cast("FrontOnKill", fr.get(fr.choice, "on_kill", FRONT_ON_KILL)),
        open_timeout=fr.get(fr.seconds, "open_timeout"),
        request_timeout=fr.get(fr.seconds, "request_timeout"),
    )

    lc = sec["logcat"]
    logcat = LogcatConfig(
        keep=lc.get(lc.boolean, "keep"),
        buffer_lines=lc.get(lc.integer, "buffer_lines", minimum=100, maximum=10_000_000),
        idle_stop=lc.get(lc.seconds, "idle_stop"),
        stall_timeout=lc.get(lc.seconds, "stall_timeout"),
    )

    d = sec["debugger"]
    state_file = d.get(d.path, "state_file", env, base_dir)
    debugger = DebuggerConfig(
        host=d.get(d.listen_host, "host", allow_non_loopback),
        ports=d.get(d.port_range, "ports"),
        current_port=d.get(d.port, "current_port"),
        auto_select_waiting=d.get(d.boolean, "auto_select_waiting"),
        state_file=state_file if state_file is not None else _default_state_file(env),
        queue_packets=d.get(d.integer, "queue_packets", minimum=1),
        relay_chunk_bytes=d.get(d.integer, "relay_chunk_bytes", minimum=4096),
        forget_after_days=d.get(d.integer, "forget_after_days", minimum=1),
        max_per_vm=d.get(d.integer, "max_per_vm", minimum=1, maximum=64),
    )

    c = sec["control"]
    control_port = c.get(c.port, "port")
    control = ControlConfig(
        host=c.get(c.listen_host, "host", allow_non_loopback),
        port=control_port,
        token=c.get(c.text, "token"),
        socket=c.get(c.control_socket, "socket", control_port, env, base_dir),
        tcp=c.get(c.boolean, "tcp"),
    )
    if not control.tcp and control.socket is None and not c.failed("socket", "tcp"):
        c.report(
            c.error(
                "tcp",
                'false turns the TCP listener off, and [control] socket = "" turns the unix '
                "socket off: the control API would not listen at all",
                False,
            )
        )

    m = sec["monitor"]
    monitor = MonitorConfig(
        thread_poll_interval=m.get(m.seconds, "thread_poll_interval"),
        always_poll_threads=m.get(m.boolean, "always_poll_threads"),
        heap_info=m.get(m.boolean, "heap_info"),
    )

    t = sec["timeouts"]
    timeouts = TimeoutsConfig(**{key: t.get(t.seconds, key) for key in DEFAULTS["timeouts"]})

    li = sec["limits"]
    limits = LimitsConfig(
        max_packet_bytes=li.get(
            li.integer, "max_packet_bytes", minimum=JDWP_HEADER_SIZE, maximum=JDWP_MAX_LENGTH
        ),
        max_inflated_bytes=li.get(li.integer, "max_inflated_bytes", minimum=1),
        max_vms=li.get(li.integer, "max_vms", minimum=1),
    )

    lg = sec["log"]
    log = LogConfig(
        format=cast("LogFormat", lg.get(lg.choice, "format", LOG_FORMATS)),
        level=cast("LogLevel", lg.get(lg.choice, "level", LOG_LEVELS)),
    )

    ex = sec["extensions"]
    extensions = ExtensionsConfig(disabled=ex.get(ex.strings, "disabled"))

    config = Config(
        scan=scan,
        adb=adb,
        debugger=debugger,
        control=control,
        monitor=monitor,
        timeouts=timeouts,
        limits=limits,
        log=log,
        security=security,
        extensions=extensions,
        front=front,
        logcat=logcat,
        source=source,
    )
    _check_ports(config, sec)
    _check_front_port(config, sec)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise ConfigProblems(problems)
    return config


def _check_ports(config: Config, sec: Mapping[str, _Section]) -> None:
    """Listening ports must not collide with each other, nor with the ports ddmd itself scans.

    Problems are reported to the sections; a rule that involves a key with a problem of its
    own is skipped.
    """
    dbg, ctl, scan = config.debugger, config.control, config.scan

    def clean(*keys: str) -> bool:
        return not any(sec[k.partition(".")[0]].failed(k.partition(".")[2]) for k in keys)

    if clean("debugger.current_port", "debugger.ports") and dbg.current_port in dbg.ports:
        sec["debugger"].report(
            sec["debugger"].error(
                "current_port",
                f"inside [debugger] ports ({dbg.ports}); choose a port outside that range",
                dbg.current_port,
            )
        )
    if clean("control.port", "debugger.ports") and ctl.port in dbg.ports:
        sec["control"].report(
            sec["control"].error(
                "port",
                f"inside [debugger] ports ({dbg.ports}); choose a port outside that range",
                ctl.port,
            )
        )
    if clean("control.port", "debugger.current_port") and ctl.port == dbg.current_port:
        sec["control"].report(
            sec["control"].error(
                "port", "same as [debugger] current_port; the two need different ports", ctl.port
            )
        )
    if not scan.enabled or not clean("scan.enabled", "scan.ports"):
        return
    scan_raw = sec["scan"].raw("ports")
    if clean("debugger.ports") and scan.ports.overlaps(dbg.ports):
        sec["scan"].report(
            sec["scan"].error(
                "ports",
                f"overlaps [debugger] ports ({dbg.ports}): ddmd would probe its own debugger ports",
                scan_raw,
            )
        )
    for port, key in ((dbg.current_port, "debugger.current_port"), (ctl.port, "control.port")):
        if clean(key) and port in scan.ports:
            sec["scan"].report(
                sec["scan"].error(
                    "ports",
                    f"includes {format_key(key)} ({port}): ddmd would probe its own port",
                    scan_raw,
                )
            )


def _check_front_port(config: Config, sec: Mapping[str, _Section]) -> None:
    """[front] port must not be one of ddmd's other ports, nor the adb server's own port as
    the file sets it (the front would relay to itself). A port that only comes from
    ANDROID_ADB_SERVER_PORT is left to the front, which refuses to start on it with a
    warning: an environment variable must not stop ddmd from starting."""
    front, dbg, ctl, scan = config.front, config.debugger, config.control, config.scan
    f = sec["front"]
    if not front.enabled or f.failed("enabled", "port"):
        return

    def clean(key: str) -> bool:
        section, _, name = key.partition(".")
        return not sec[section].failed(name)

    clashes: list[tuple[bool, str]] = [
        (
            clean("debugger.ports") and front.port in dbg.ports,
            f"inside [debugger] ports ({dbg.ports}); choose a port outside that range",
        ),
        (
            clean("debugger.current_port") and front.port == dbg.current_port,
            "same as [debugger] current_port; the two need different ports",
        ),
        (
            clean("control.port") and front.port == ctl.port,
            "same as [control] port; the two need different ports",
        ),
        (
            scan.enabled
            and clean("scan.enabled")
            and clean("scan.ports")
            and front.port in scan.ports,
            f"inside [scan] ports ({scan.ports}): ddmd would probe its own port",
        ),
        (
            sec["adb"].is_set("port")
            and clean("adb.port")
            and clean("adb.host")
            and front.port == config.adb.port
            and is_loopback_host(config.adb.host)
            and clean("front.host")
            and is_loopback_host(front.host),
            "same as [adb] port: the front would relay to itself; for a front on adb's usual "
            "port, move the real server with [adb] port (e.g. 5039)",
        ),
    ]
    for clash, message in clashes:
        if clash:
            f.report(f.error("port", message, front.port))
            return


def load_config(
    path: str | os.PathLike[str] | None, *, env: Mapping[str, str] | None = None
) -> Config:
    """Read and check a TOML config file; None gives `Config.default()`.

    `env` (default: os.environ, read now) is passed on to `parse_config`.
    """
    if path is None:
        return Config.default(env=env)
    source = os.fspath(path)
    file = Path(source)
    try:
        with file.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError("no such file", path=source) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, not a config file", path=source) from None
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror or exc}", path=source) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (bad byte at offset {exc.start})", path=source) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", path=source) from None
    return parse_config(data, source=source, env=env, base_dir=file.parent)


def find_config_file(explicit: str | None, env: Mapping[str, str]) -> Path | None:
    """The config file to use: `--config`, then $DDMD_CONFIG, then the user's file, else None.

    An explicit path (option or variable) must exist. The user's file,
    `$XDG_CONFIG_HOME/ddmd/config.toml` or `~/.config/ddmd/config.toml`, is used only if it exists;
    None means "use the built-in defaults".
    """
    for given, what in ((explicit, "--config"), (env.get("DDMD_CONFIG") or None, "$DDMD_CONFIG")):
        if given is None:
            continue
        path = Path(given)
        if not path.exists():
            raise ConfigError(f"no such file (given by {what})", path=given)
        if not path.is_file():
            raise ConfigError(f"not a regular file (given by {what})", path=given)
        return path
    xdg = env.get("XDG_CONFIG_HOME", "")
    if xdg and os.path.isabs(xdg):
        base = Path(xdg)
    elif env.get("HOME"):
        base = Path(env["HOME"]) / ".config"
    else:
        return None
    candidate = base / "ddmd" / "config.toml"
    return candidate if candidate.is_file() else None
