"""Which app wrote a log entry: by pid, from what ddmd knows of the device's VMs (track-jdwp,
HELO, APNM) and from ActivityManager's own lines for the processes ddmd does not hold.

Layer: standard library and ``ddmd.protocol`` only (sans-IO).

- ``Start proc P:APP/...`` (ActivityManager) says "pid P is app A" for any app, debuggable or
  not, at the moment it happens: the log's own order.
- ddmd's VMs say the same (``sync``) for now: used for a pid no log line named (a log opened
  after the app started), and to see a restart the log does not tell. The first ``sync`` only
  learns: the backlog that follows is older than what ddmd knows now, and must not be read as
  restarts.
- ``Process APP (pid P) has died`` ends it: that line still belongs to APP, later ones of P
  belong to nobody until P is someone's again, so a different app that reuses the pid is never
  shown as the old one.
- A new pid for an app that had another one is a restart: ``Restart`` separators.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ddmd.protocol.logcat import LogEntry

__all__ = ["AppTracker", "Seen"]

_START_PROC = re.compile(r"^Start proc (\d+):([^/\s]+)(?:/|\s)")
_DIED = re.compile(r"^Process (\S+) \(pid (\d+)\) has died")


@dataclass(frozen=True, slots=True)
class Seen:
    """An app's pid changed: ``old_pid`` -> ``new_pid``."""

    app: str
    old_pid: int
    new_pid: int


class AppTracker:
    """pid -> app of one device, kept as entries and ddmd's VM list arrive."""

    def __init__(self) -> None:
        self._app_of: dict[int, str] = {}  # from the log's lines
        self._pid_of: dict[str, int] = {}  # each app's newest pid, from either source
        self._vm_app_of: dict[int, str] = {}  # from ddmd's VMs, last time
        self._vm_pid_of: dict[str, int] = {}
        self._synced = False

    def app_of(self, pid: int) -> str | None:
        found = self._app_of.get(pid)
        return found if found is not None else self._vm_app_of.get(pid)

    def sync(self, vms: Mapping[int, str]) -> list[Seen]:
        """ddmd's VMs on this device now (pid -> app or package): the restarts they show that
        the log has not told already."""
        out: list[Seen] = []
        pid_of = {app: pid for pid, app in vms.items()}
        if self._synced:
            for app, pid in pid_of.items():
                old = self._vm_pid_of.get(app)
                if old is not None and old != pid and self._pid_of.get(app) != pid:
                    out.append(Seen(app, self._pid_of.get(app, old), pid))
                    self._pid_of[app] = pid
        self._synced = True
        self._vm_app_of, self._vm_pid_of = dict(vms), pid_of
        return out

    def observe(self, entry: LogEntry) -> tuple[str | None, list[Seen]]:
        """The app of ``entry``, and restarts its text reveals (ActivityManager's lines)."""
        seen: list[Seen] = []
        if entry.tag == "ActivityManager":
            started = _START_PROC.match(entry.message)
            if started is not None:
                app = started.group(2)
                return app, self._bind(int(started.group(1)), app)  # the line is the app's news
            else:
                died = _DIED.match(entry.message)
                if died is not None:
                    app, pid = died.group(1), int(died.group(2))
                    if self._app_of.get(pid) == app:
                        del self._app_of[pid]
                    return app, seen  # the line itself is the app's news
        return self.app_of(entry.pid), seen

    def _bind(self, pid: int, app: str) -> list[Seen]:
        previous_app = self._app_of.get(pid)
        if previous_app == app:
            return []
        if previous_app is not None and self._pid_of.get(previous_app) == pid:
            del self._pid_of[previous_app]
        self._app_of[pid] = app
        old = self._pid_of.get(app)
        self._pid_of[app] = pid
        if old is not None and old != pid:
            if self._app_of.get(old) == app:
                del self._app_of[old]
            return [Seen(app, old, pid)]
        return []
