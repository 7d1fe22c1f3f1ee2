"""ddmd's configuration: `schema` (the sections as frozen dataclasses, defaults, port ranges,
host rules, and the table of how each key is read), `section` (one section read by that table),
`checks` (rules across keys and sections) and `parse` (a TOML file checked key by key into a
`Config`, every problem named).

Layer: standard library and `ddmd.errors` only; used by nearly every module above `protocol/`
and `session/`. No environment reads at import, no logging, no sockets.
"""

from ddmd.config.parse import Config, find_config_file, load_config, parse_config
from ddmd.config.schema import (
    ADB_MODES,
    DEFAULT_ADB_PORT,
    LOG_FORMATS,
    LOG_LEVELS,
    AdbConfig,
    AdbMode,
    ControlConfig,
    DebuggerConfig,
    ExtensionsConfig,
    LimitsConfig,
    LogConfig,
    LogFormat,
    LogLevel,
    MonitorConfig,
    PortRange,
    ScanConfig,
    SecurityConfig,
    TimeoutsConfig,
    is_loopback_host,
)

__all__ = [
    "ADB_MODES",
    "DEFAULT_ADB_PORT",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "AdbConfig",
    "AdbMode",
    "Config",
    "ControlConfig",
    "DebuggerConfig",
    "ExtensionsConfig",
    "LimitsConfig",
    "LogConfig",
    "LogFormat",
    "LogLevel",
    "MonitorConfig",
    "PortRange",
    "ScanConfig",
    "SecurityConfig",
    "TimeoutsConfig",
    "find_config_file",
    "is_loopback_host",
    "load_config",
    "parse_config",
]
