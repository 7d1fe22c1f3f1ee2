"""Crashes and restarts of each app of one device, counted for ``/metrics``
(``ddmd_app_crashes_total``, ``ddmd_app_restarts_total``).

Layer: standard library only (sans-IO: every call is given ``now``, seconds on any clock that
only goes forward).

A counter that appears at 1 hides its first increase from Prometheus (``increase()`` needs a
sample before it), and the crash that makes it 1 usually ends the app's VM. So an app is
counted from when it is known (``seen``: a VM of it on the device, at a scrape), at 0 for every
kind, and its counts stay after its VM is gone: until it has been neither seen nor counted for
`FORGET_AFTER` seconds. At most `MAX_APPS` apps per device: beyond that a known app is not
added, but a crash or a restart makes room by forgetting the app seen longest ago.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

__all__ = ["CRASH_KINDS", "FORGET_AFTER", "MAX_APPS", "UNKNOWN_APP", "AppCount", "AppCounts"]

#: The kinds of crash ``crashes.CrashDetector`` reports, and "died": ActivityManager's "Process
#: APP (pid P) has died" with no crash report of that app just before (the system killed it, it
#: was stopped or restarted). A died is counted, never announced as ``app.crashed``.
CRASH_KINDS: Final = ("java", "native", "anr", "died")
#: Seconds an app's counts are kept after it was last seen (a VM of it) or counted.
FORGET_AFTER: Final = 3600.0
#: Apps counted per device, at most.
MAX_APPS: Final = 256
#: The app of a crash the log does not name.
UNKNOWN_APP: Final = "unknown"


@dataclass(frozen=True, slots=True)
class AppCount:
    """One app's counts: crashes by kind (every kind of `CRASH_KINDS`), and restarts."""

    app: str
    crashes: tuple[tuple[str, int], ...]
    restarts: int


@dataclass(slots=True)
class _Counts:
    last_seen: float
    crashes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CRASH_KINDS, 0))
    restarts: int = 0


class AppCounts:
    """The counts of one device's apps, bounded (`MAX_APPS`, `FORGET_AFTER`)."""

    def __init__(self, *, max_apps: int = MAX_APPS, forget_after: float = FORGET_AFTER) -> None:
        self._max_apps = max_apps
        self._forget_after = forget_after
        self._apps: dict[str, _Counts] = {}

    def __len__(self) -> int:
        return len(self._apps)

    def seen(self, app: str, now: float) -> None:
        """``app`` is on the device now: counted from here (at 0), kept while it is seen."""
        found = self._apps.get(app)
        if found is not None:
            found.last_seen = now
        elif len(self._apps) < self._max_apps:
            self._apps[app] = _Counts(now)

    def crashed(self, app: str | None, kind: str, now: float) -> None:
        counts = self._counted(app, now)
        counts.crashes[kind] = counts.crashes.get(kind, 0) + 1

    def restarted(self, app: str, now: float) -> None:
        self._counted(app, now).restarts += 1

    def counts(self, now: float) -> list[AppCount]:
        """Every app's counts, by name (apps not seen for `FORGET_AFTER` are forgotten first)."""
        self.forget(now)
        return [
            AppCount(app, tuple(c.crashes.items()), c.restarts)
            for app, c in sorted(self._apps.items())
        ]

    def forget(self, now: float) -> None:
        old = [app for app, c in self._apps.items() if now - c.last_seen > self._forget_after]
        for app in old:
            del self._apps[app]

    def _counted(self, app: str | None, now: float) -> _Counts:
        name = app or UNKNOWN_APP
        found = self._apps.get(name)
        if found is None:
            self.forget(now)
            if len(self._apps) >= self._max_apps:
                oldest = min(self._apps, key=lambda a: self._apps[a].last_seen)
                del self._apps[oldest]
            found = self._apps[name] = _Counts(now)
        found.last_seen = now
        return found
