"""ddmd's configuration read from TOML: a file read with `tomllib`, every key checked by its rule
in `config.schema.SECTIONS`, into a `Config` (the frozen dataclasses of `config.schema`, one
per section).

Layer: imports only the standard library, the other modules of `config` and `ddmd.errors`; used
(through `ddmd.config`) by `daemon`, `cli` and the modules that take a `Config`. No environment
reads at import, no logging, no sockets: the environment is read only inside
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddmd.config.checks import AFTER_SECTION, check_front_port, check_ports
from ddmd.config.schema import (
    DEFAULTS,
    SECTIONS,
    AdbConfig,
    ControlConfig,
    DebuggerConfig,
    ExtensionsConfig,
    FrontConfig,
    Given,
    LimitsConfig,
    LogcatConfig,
    LogConfig,
    MetricsConfig,
    MonitorConfig,
    Rule,
    ScanConfig,
    SecurityConfig,
    TimeoutsConfig,
    ValueOf,
)
from ddmd.config.section import SectionReader, _suggest, _toml_type
from ddmd.errors import ConfigError, ConfigProblems, format_key

__all__ = ["Config", "find_config_file", "load_config", "parse_config"]


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration: one dataclass of `config.schema` per section. `source` (the
    file it came from) takes no part in equality."""

    scan: ScanConfig
    adb: AdbConfig
    debugger: DebuggerConfig
    control: ControlConfig
    monitor: MonitorConfig
    timeouts: TimeoutsConfig
    limits: LimitsConfig
    log: LogConfig
    security: SecurityConfig
    extensions: ExtensionsConfig = field(default_factory=ExtensionsConfig)
    front: FrontConfig = field(default_factory=FrontConfig)
    logcat: LogcatConfig = field(default_factory=LogcatConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    source: str | None = field(default=None, compare=False)

    @classmethod
    def default(cls, *, env: Mapping[str, str] | None = None) -> Config:
        """The built-in defaults; `env` (default: os.environ, read now) fills env-dependent ones."""
        return parse_config({}, source="<defaults>", env=env)


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
    tables = _section_tables(data, source, problems)
    sec = {name: SectionReader(name, tables.get(name, {}), source, problems) for name in DEFAULTS}
    for section in sec.values():
        section.check_unknown_keys()
    document = _Document(sec, env, base_dir)
    for name in SECTIONS:
        document.read(name)
    config = Config(**document.values, source=source)
    check_ports(config, sec)
    check_front_port(config, sec)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise ConfigProblems(problems)
    return config


def _section_tables(
    data: Mapping[str, Any], source: str, problems: list[ConfigError]
) -> dict[str, Mapping[str, object]]:
    """The document's [section] tables; anything else at the top level is a problem (a key
    that belongs in a section is told which)."""
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
    return tables


class _Document:
    """The sections read so far, each by its row of `SECTIONS`, and what their rules are given."""

    def __init__(
        self, sec: Mapping[str, SectionReader], env: Mapping[str, str], base_dir: Path | None
    ) -> None:
        self._sec = sec
        self._env = env
        self._base_dir = base_dir
        self.values: dict[str, Any] = {}

    def read(self, name: str) -> None:
        """Read section ``name`` key by key into its dataclass, then check it as a whole."""
        section, schema = self._sec[name], SECTIONS[name]
        read: dict[str, object] = {}
        for key, rule in schema.keys.items():
            read[key] = self._read_key(section, key, rule, read)
        value = self.values[name] = schema.cls(**read)
        if name in AFTER_SECTION:
            AFTER_SECTION[name](value, section)

    def _read_key(
        self, section: SectionReader, key: str, rule: Rule, read: Mapping[str, object]
    ) -> object:
        args = [self._given(arg, read) for arg in rule.args]
        return section.get(getattr(section, rule.reader), key, *args, **rule.options)

    def _given(self, arg: object, read: Mapping[str, object]) -> object:
        if isinstance(arg, ValueOf):
            return read[arg.key]
        if arg is Given.ENV:
            return self._env
        if arg is Given.BASE_DIR:
            return self._base_dir
        if arg is Given.LOOPBACK_RULE:
            # Unknown when that key itself is wrong: then the loopback rule is not applied.
            if self._sec["security"].failed("allow_non_loopback"):
                return None
            return self.values["security"].allow_non_loopback
        return arg


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
