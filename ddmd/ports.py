"""PortBook: which per-VM debugger port belongs to which app, kept across restarts.

Layer: plain logic plus one small JSON state file; no sockets. The key of a VM is
``"DEVICE|NAME"``: the device serial ("local" for workstation VMs) and the package or app name,
or, for a VM that never reports a name (a plain JVM), its address. An IDE configured for
localhost:8603 keeps working when the app restarts with a new pid, because the same key gets the
same port again.

The file is small (one entry per app ever seen, capped) and rewritten atomically (temp file and
``os.replace``). A missing, unreadable or corrupt file is not fatal: the book starts empty and
the problem is reported through ``problems`` for the caller to log.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ddmd.config import PortRange

MAX_ENTRIES = 4096
VERSION = 1


def vm_key(device: str | None, name: str) -> str:
    return f"{device or 'local'}|{name}"


class PortBook:
    """Assignments ``key -> port`` within ``ports``; persisted in ``path`` (None: memory only)."""

    def __init__(self, path: Path | None, ports: PortRange) -> None:
        self._path = path
        self._ports = ports
        self._assigned: dict[str, int] = {}
        self.problems: list[str] = []
        if path is not None:
            self._load(path)

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
        ignored: list[str] = []
        for key, port in entries.items():
            if isinstance(key, str) and type(port) is int and port in self._ports:
                self._assigned[key] = port
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
        """``key`` now owns ``port`` (any other key holding it loses it)."""
        for k in [k for k, p in self._assigned.items() if p == port and k != key]:
            del self._assigned[k]
        self._assigned.pop(key, None)
        self._assigned[key] = port  # re-inserted last: most recently used
        while len(self._assigned) > MAX_ENTRIES:
            del self._assigned[next(iter(self._assigned))]

    def save(self) -> None:
        """Write the file atomically; raises OSError for the caller to log."""
        if self._path is None:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"version": VERSION, "ports": self._assigned}, indent=1)
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
