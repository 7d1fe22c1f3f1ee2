"""PortBook: which per-VM debugger port belongs to which app, kept across restarts.

Layer: plain logic plus one small JSON state file; no sockets. The key of a VM is
``"DEVICE|NAME"``: the device serial ("local" for workstation VMs) and the package or app name,
or, for a VM that never reports a name (a plain JVM), its address. An IDE configured for
localhost:8603 keeps working when the app restarts with a new pid, because the same key gets the
same port again.

The file is small (one entry per app seen lately, capped) and rewritten atomically (temp file
and ``os.replace``). A missing, unreadable or corrupt file is not fatal: the book starts empty
and the problem is reported through ``problems`` for the caller to log.

The book does not grow forever: each entry has a ``last_seen`` time (wall clock, updated when
the app's VM gets its port and while it stays connected), and ``expire()`` drops the entries
not seen for ``[debugger] forget_after_days``. The file keeps the original shape, with the
times beside the ports, so an older ddmd still reads it::

    {"version": 1,
     "ports": {"emulator-5554|com.example.mail": 8600},
     "last_seen": {"emulator-5554|com.example.mail": "2024-05-01T12:00:00Z"}}

A file without ``last_seen`` (written by an older ddmd), or an entry without a readable time,
counts as seen when it is loaded. The clock is injected (``clock``), so expiry is tested
without waiting.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ddmd.config import PortRange
from ddmd.errors import TargetError

MAX_ENTRIES = 4096
VERSION = 1
SECONDS_PER_DAY = 86400.0

#: Wall-clock seconds since the epoch (``time.time``); tests pass their own.
Clock = Callable[[], float]


def vm_key(device: str | None, name: str) -> str:
    return f"{device or 'local'}|{name}"


def split_key(key: str) -> tuple[str, str]:
    """``"emulator-5554|com.example"`` -> ("emulator-5554", "com.example")."""
    device, _, name = key.partition("|")
    return device, name


def format_time(seconds: float) -> str:
    """ISO-8601 UTC to the second: ``2024-05-01T12:00:00Z``."""
    return _format_second(int(seconds // 1))


@functools.lru_cache(maxsize=1024)
def _format_second(second: int) -> str:
    # Cached: a book of hundreds of VMs seen in the same few seconds is written out often.
    return datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: object) -> float | None:
    """An ISO-8601 time with a zone (or epoch seconds) -> epoch seconds; None if unreadable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return None
        if moment.tzinfo is None:
            return None
        seconds = moment.timestamp()
    else:
        return None
    return seconds if seconds == seconds and abs(seconds) < 1e12 else None  # no NaN, no year 30k


@dataclass(frozen=True, slots=True)
class PortEntry:
    """One line of the book: an app (its key), its port, when its VM was last seen."""

    key: str
    port: int
    last_seen: float

    @property
    def device(self) -> str:
        return split_key(self.key)[0]

    @property
    def name(self) -> str:
        return split_key(self.key)[1]

    def label(self) -> str:
        """How a candidate list shows the entry: ``emulator-5554|com.example (port 8600)``."""
        return f"{self.key} (port {self.port})"

    def to_json(self, *, in_use: bool, vm: str | None = None) -> dict[str, Any]:
        return {
            "key": self.key,
            "device": self.device,
            "app": self.name,
            "port": self.port,
            "last_seen": format_time(self.last_seen),
            "in_use": in_use,
            "vm": vm,
        }


class PortBook:
    """Assignments ``key -> port`` within ``ports``; persisted in ``path`` (None: memory only)."""

    def __init__(self, path: Path | None, ports: PortRange, *, clock: Clock = time.time) -> None:
        self._path = path
        self._ports = ports
        self._clock = clock
        self._assigned: dict[str, int] = {}
        self._seen: dict[str, float] = {}
        self.problems: list[str] = []
        if path is not None:
            self._load(path)

    @property
    def path(self) -> Path | None:
        return self._path

    def _load(self, path: Path) -> None:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            self.problems.append(f"cannot read {path}: {exc}")
            return
        try:
            # json.loads decodes the bytes itself; bad UTF-8 is a ValueError like bad JSON.
            data = json.loads(raw)
            entries = data["ports"] if isinstance(data, dict) else None
            if not isinstance(entries, dict):
                raise ValueError("no 'ports' object")
        except (ValueError, KeyError, TypeError) as exc:
            self.problems.append(f"ignoring corrupt state file {path}: {exc}")
            return
        seen = data.get("last_seen")
        if not isinstance(seen, dict):
            seen = {}  # a file from before last_seen existed
        now = self._clock()
        ignored: list[str] = []
        for key, port in entries.items():
            if isinstance(key, str) and type(port) is int and port in self._ports:
                self._assigned[key] = port
                when = parse_time(seen.get(key))
                self._seen[key] = now if when is None else when
            else:
                ignored.append(f"{key!r}: {port!r}")
        if ignored:
            # One line, not one per entry: after [debugger] ports changed, every old entry
            # is outside the range, and hundreds of warnings would drown the log.
            shown = ", ".join(ignored[:3]) + (
                f", ... ({len(ignored)} in all)" if len(ignored) > 3 else ""
            )
            self.problems.append(
                f"ignoring {len(ignored)} entries of {path} that are not ports in "
                f"[debugger] ports {self._ports}: {shown}"
            )

    def get(self, key: str) -> int | None:
        return self._assigned.get(key)

    def candidates(self, key: str, in_use: set[int]) -> Iterator[int]:
        """Ports to try for ``key``, best first: its own port, then free unreserved ones, then
        ports reserved by apps that are not running (oldest entries first)."""
        own = self._assigned.get(key)
        if own is not None and own not in in_use:
            yield own
        reserved = {p for k, p in self._assigned.items() if k != key}
        for port in self._ports:
            if port not in in_use and port not in reserved and port != own:
                yield port
        for k, port in list(self._assigned.items()):
            if k != key and port not in in_use:
                yield port

    def record(self, key: str, port: int) -> None:
        """``key`` now owns ``port`` (any other key holding it loses it); seen now."""
        for k in [k for k, p in self._assigned.items() if p == port and k != key]:
            self._drop(k)
        self._assigned.pop(key, None)
        self._assigned[key] = port  # re-inserted last: most recently used
        self._seen[key] = self._clock()
        while len(self._assigned) > MAX_ENTRIES:
            self._drop(next(iter(self._assigned)))

    def touch(self, keys: Iterable[str]) -> None:
        """The VMs of these apps are connected now: they were seen now."""
        now = self._clock()
        for key in keys:
            if key in self._assigned:
                self._seen[key] = now

    def expire(self, max_age: float, *, keep: Iterable[str] = ()) -> list[PortEntry]:
        """Drop the entries not seen for more than ``max_age`` seconds (never those in
        ``keep``: apps connected now); returns what was dropped, oldest first."""
        if max_age <= 0:
            raise ValueError(f"max_age must be positive, got {max_age!r}")
        kept = set(keep)
        limit = self._clock() - max_age
        old = [e for e in self.entries() if e.last_seen < limit and e.key not in kept]
        for entry in old:
            self._drop(entry.key)
        return sorted(old, key=lambda e: e.last_seen)

    def sweep(self, max_age: float, connected: Iterable[str]) -> list[PortEntry]:
        """The periodic clean-up: the ``connected`` apps were seen now, and the entries not
        seen for more than ``max_age`` seconds are dropped (returned, oldest first)."""
        keys = set(connected)
        self.touch(keys)
        return self.expire(max_age, keep=keys)

    def forget(self, key: str) -> PortEntry | None:
        """Remove one entry; returns it (None if there was none)."""
        entry = self.entry(key)
        if entry is not None:
            self._drop(key)
        return entry

    def entry(self, key: str) -> PortEntry | None:
        port = self._assigned.get(key)
        if port is None:
            return None
        return PortEntry(key, port, self._seen.get(key, self._clock()))

    def entries(self) -> list[PortEntry]:
        """Every entry, in file order (least recently assigned first)."""
        now = self._clock()
        return [PortEntry(k, p, self._seen.get(k, now)) for k, p in self._assigned.items()]

    def match(self, app: str, *, device: str | None = None) -> list[PortEntry]:
        """The entries an app argument names: its exact key ("DEVICE|NAME"), else every entry
        whose name is exactly ``app`` (on ``device`` only, when given)."""
        exact = self.entry(app)
        if exact is not None and (device is None or exact.device == device):
            return [exact]
        return [
            e for e in self.entries() if e.name == app and (device is None or e.device == device)
        ]

    def resolve(self, app: str, *, device: str | None = None) -> PortEntry:
        """The one entry ``app`` names (see ``match``); TargetError (with the candidates)
        when none or several do."""
        app = app.strip()
        matches = self.match(app, device=device) if app else []
        if len(matches) == 1:
            return matches[0]
        if not matches:
            where = f" on device {device}" if device else ""
            raise TargetError(
                f"no remembered debugger port for {app!r}{where}",
                candidates=tuple(e.label() for e in self.entries()),
            )
        raise TargetError(
            f"{app!r} has remembered ports on several devices; give --device SERIAL or the "
            "whole DEVICE|NAME key",
            candidates=tuple(e.label() for e in matches),
            ambiguous=True,
        )

    def _drop(self, key: str) -> None:
        self._assigned.pop(key, None)
        self._seen.pop(key, None)

    def dumps(self) -> str:
        """The file's content now (cheap; call it where the book is changed, then ``write``
        it elsewhere, e.g. in a worker thread)."""
        return json.dumps(
            {
                "version": VERSION,
                "ports": dict(self._assigned),
                "last_seen": {k: format_time(self._seen[k]) for k in self._assigned},
            },
            indent=1,
        )

    def save(self) -> None:
        """Write the file atomically; raises OSError for the caller to log."""
        self.write(self.dumps())

    def write(self, data: str) -> None:
        """Write ``data`` (from ``dumps``) atomically; raises OSError for the caller to log."""
        if self._path is None:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".ports-", dir=self._path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(data)
            os.replace(tmp, self._path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def items(self) -> list[tuple[str, int]]:
        return list(self._assigned.items())
