"""One TOML table of the config, read key by key: each value checked for its type and range,
every problem collected with the key's place and the fix (``SectionReader``; its readers are the
ones ``schema.SECTIONS`` names), and the did-you-mean for unknown names; paths in the config
($NAME expanded, relative to the file) and the runtime directory.

Layer: standard library and ``ddmd.config.schema`` (used by ``parse.py``).
"""

from __future__ import annotations

import difflib
import math
import os
import pwd
import string
import tempfile
from collections.abc import Callable, Mapping
from datetime import date, datetime, time
from pathlib import Path
from typing import Any, Final, TypeVar, cast

from ddmd.config.schema import (
    ADB_MODES,
    DEFAULT_ADB_PORT,
    DEFAULTS,
    MAX_METRICS_HOST,
    MAX_PORT,
    MAX_SOCKET_PATH,
    MIN_PORT,
    PortRange,
    host_problem,
    is_int,
    is_loopback_host,
    this_host,
)
from ddmd.errors import ConfigError


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

#: ``[debugger] relay_threads`` was one of these words before it became a boolean; a config file
#: written then still starts ddmd ("local" and "all" now mean the thread for every VM).
_OLD_RELAY_THREADS: Final = {"local": True, "all": True, "off": False}


class SectionReader:
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

    def adb_mode(self, key: str) -> str:
        """``[adb] enabled``: one of `ADB_MODES`; ``true``/``false`` (which read naturally in
        TOML) are taken as "on"/"off"."""
        if isinstance(value := self.raw(key), bool):
            return "on" if value else "off"
        return self.choice(key, ADB_MODES)

    def adb_port(self, key: str, env: Mapping[str, str]) -> int:
        """``[adb] port``; when the file does not set it, ANDROID_ADB_SERVER_PORT (adb's own
        rule) wins over the default. A variable that is no port is reported, and the default
        taken."""
        raw = env.get("ANDROID_ADB_SERVER_PORT", "")
        if self.is_set(key) or not raw:
            return self.port(key)
        port = int(raw) if raw.isascii() and raw.isdigit() else -1
        if not MIN_PORT <= port <= MAX_PORT:
            self.report(
                self.error(
                    key,
                    "the default comes from the environment variable ANDROID_ADB_SERVER_PORT, "
                    "which is not a port number; fix the variable or set [adb] port",
                    raw,
                )
            )
            return DEFAULT_ADB_PORT
        return port

    def relay_threads(self, key: str) -> bool:
        """``[debugger] relay_threads``: true or false (or one of the words it used to take)."""
        raw = self.raw(key)
        if isinstance(raw, str) and raw.strip().lower() in _OLD_RELAY_THREADS:
            return _OLD_RELAY_THREADS[raw.strip().lower()]
        return self.boolean(key)

    def state_file(self, key: str, env: Mapping[str, str], base_dir: Path | None) -> Path:
        """``[debugger] state_file`` as `path` reads it; "" is the XDG state directory's."""
        path = self.path(key, env, base_dir)
        return path if path is not None else _default_state_file(env)

    def host(self, key: str) -> str:
        value = self.text(key, allow_empty=False)
        problem = host_problem(value)
        if problem is not None:
            raise self.error(key, problem, value)
        return value

    def metrics_host(self, key: str) -> str:
        """``[metrics] host``: the ``host`` label of every metric; "" is this machine's host
        name. Printable, at most `MAX_METRICS_HOST` characters, not only spaces."""
        value = self.text(key)
        if value == "":
            return this_host()
        if not value.strip():
            raise self.error(key, 'must not be only spaces (write "" for the host name)', value)
        if not value.isprintable():
            raise self.error(key, "must be printable (no tabs, newlines or control codes)", value)
        if len(value) > MAX_METRICS_HOST:
            raise self.error(
                key, f"is {len(value)} characters long; at most {MAX_METRICS_HOST}", value
            )
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


def _default_state_file(env: Mapping[str, str]) -> Path:
    xdg = env.get("XDG_STATE_HOME", "")
    # The XDG spec says relative values are invalid and must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else _home(env) / ".local" / "state"
    return base / "ddmd" / "ports.json"


def _home(env: Mapping[str, str]) -> Path:
    home = env.get("HOME", "")
    return Path(home) if home else Path.home()


def runtime_dir(env: Mapping[str, str]) -> Path:
    """ddmd's directory for its lock files and control socket: ``$XDG_RUNTIME_DIR/ddmd``, or
    ``/tmp/ddmd-UID`` when the variable is unset or relative (the XDG spec says to ignore a
    relative value)."""
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime):
        return Path(runtime) / "ddmd"
    return Path(tempfile.gettempdir()) / f"ddmd-{os.getuid()}"
