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

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, cast

from ddmd.config.checks import _check_front_port, _check_ports
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
    ScanConfig,
    SecurityConfig,
    TimeoutsConfig,
    UnknownPeer,
)
from ddmd.config.section import _home, _Section, _suggest, _toml_type
from ddmd.errors import ConfigError, ConfigProblems, format_key

__all__ = ["find_config_file", "load_config", "parse_config"]


# --------------------------------------------------------------------------------------------------
# Reading values


#: ``[debugger] relay_threads`` was one of these words before it became a boolean; a config file
#: written then still starts ddmd ("local" and "all" now mean the thread for every VM).
_OLD_RELAY_THREADS: Final = {"local": True, "all": True, "off": False}


def _relay_threads(d: _Section) -> bool:
    """``[debugger] relay_threads``: true or false (or one of the words it used to take)."""
    raw = d.raw("relay_threads")
    if isinstance(raw, str) and raw.strip().lower() in _OLD_RELAY_THREADS:
        return _OLD_RELAY_THREADS[raw.strip().lower()]
    return d.get(d.boolean, "relay_threads")


def _default_state_file(env: Mapping[str, str]) -> Path:
    xdg = env.get("XDG_STATE_HOME", "")
    # The XDG spec says relative values are invalid and must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else _home(env) / ".local" / "state"
    return base / "ddmd" / "ports.json"


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
        relay_threads=_relay_threads(d),
        relay_spin_us=d.get(d.integer, "relay_spin_us", minimum=0, maximum=1000),
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
