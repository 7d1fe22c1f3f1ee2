"""Checks across keys and sections of the config: [scan] backs off no faster than it scans,
[control] listens somewhere, and ddmd's ports must not clash with each other, with the scan
range or with the adb server's port.

Layer: standard library, ``ddmd.config.schema`` and ``ddmd.config.section`` (used by
``parse.py``: `AFTER_SECTION` once that section was read, `check_ports` and `check_front_port`
once every section was).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

from ddmd.config.schema import (
    AdbConfig,
    ControlConfig,
    DebuggerConfig,
    FrontConfig,
    ScanConfig,
    is_loopback_host,
)
from ddmd.config.section import SectionReader
from ddmd.errors import format_key

__all__ = ["AFTER_SECTION", "Listeners", "check_front_port", "check_ports"]


def _check_scan(scan: ScanConfig, s: SectionReader) -> None:
    if not s.failed("interval", "backoff_max") and scan.backoff_max < scan.interval:
        s.report(
            s.error(
                "backoff_max",
                f"must not be below [scan] interval ({scan.interval:g} s)",
                s.raw("backoff_max"),
            )
        )


def _check_control(control: ControlConfig, c: SectionReader) -> None:
    if not control.tcp and control.socket is None and not c.failed("socket", "tcp"):
        c.report(
            c.error(
                "tcp",
                'false turns the TCP listener off, and [control] socket = "" turns the unix '
                "socket off: the control API would not listen at all",
                False,
            )
        )


#: The checks across the keys of one section, run as soon as that section was read.
AFTER_SECTION: Final[Mapping[str, Callable[[Any, SectionReader], None]]] = {
    "scan": _check_scan,
    "control": _check_control,
}


class Listeners(Protocol):
    """The sections the port checks read (a `Config`)."""

    @property
    def scan(self) -> ScanConfig: ...
    @property
    def adb(self) -> AdbConfig: ...
    @property
    def front(self) -> FrontConfig: ...
    @property
    def debugger(self) -> DebuggerConfig: ...
    @property
    def control(self) -> ControlConfig: ...


def check_ports(config: Listeners, sec: Mapping[str, SectionReader]) -> None:
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


def check_front_port(config: Listeners, sec: Mapping[str, SectionReader]) -> None:
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
