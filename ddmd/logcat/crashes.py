"""Crashes in a device's log: a Java crash's ``FATAL EXCEPTION`` block (AndroidRuntime), a
native crash's ``Fatal signal`` line (libc) and tombstone (DEBUG), an ANR (ActivityManager
``ANR in APP``) and ActivityManager's ``Process APP (pid P) has died``. Their lines are
marked, attributed to the app that crashed (tombstone and ANR lines come from other
processes), and each crash is reported once.

Layer: standard library and ``ddmd.protocol`` only (sans-IO).

A block is the run of entries of one kind that follows its first line (same tag, and for a
Java crash the same pid); it ends at the first entry that is not part of it, or when the
stream goes quiet (``flush``). A multi-line entry may hold a whole block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddmd.protocol.logcat import LogEntry

__all__ = ["MAX_LINES", "Crash", "CrashDetector"]

#: Lines of a crash kept for its report (the first ones: the exception and its top frames).
MAX_LINES = 12
#: Seconds between a "Fatal signal" line and the tombstone that belongs to it, at most.
_FATAL_TO_TOMBSTONE = 10.0
#: A block longer than this is over (a runaway tag).
_MAX_BLOCK = 400

_PROCESS = re.compile(r"Process: ([^,\s]+), PID: (\d+)")
_TOMBSTONE_START = "*** *** *** *** *** *** *** *** *** *** *** *** *** *** *** ***"
_TOMBSTONE_WHO = re.compile(r"pid: (\d+), tid: \d+, name: .*>>> (\S+) <<<")
_ANR = re.compile(r"^ANR in (\S+)")
_ANR_PID = re.compile(r"^PID: (\d+)", re.MULTILINE)
_DIED = re.compile(r"^Process (\S+) \(pid (\d+)\) has died")


@dataclass(frozen=True, slots=True)
class Crash:
    """One crash: what kind, whose, and its first lines (for ``app.crashed``)."""

    kind: str  # "java", "native", "anr"
    app: str | None
    pid: int | None
    lines: tuple[str, ...]
    time: float


@dataclass(slots=True)
class _Block:
    kind: str
    tag: str
    pid: int  # the writer's pid (the crashing app's for Java crashes)
    time: float
    app: str | None = None
    app_pid: int | None = None
    lines: list[str] = field(default_factory=list)
    entries: int = 0

    def take(self, entry: LogEntry) -> None:
        self.entries += 1
        for text in entry.message.splitlines():
            if len(self.lines) < MAX_LINES and text.strip():
                self.lines.append(text.rstrip())
        if self.kind == "java":
            found = _PROCESS.search(entry.message)
            if found is not None:
                self.app, self.app_pid = found.group(1), int(found.group(2))
        elif self.kind == "native":
            found = _TOMBSTONE_WHO.search(entry.message)
            if found is not None:
                self.app_pid, self.app = int(found.group(1)), found.group(2)
        elif self.kind == "anr":
            found = _ANR_PID.search(entry.message)
            if found is not None:
                self.app_pid = int(found.group(1))

    def report(self) -> Crash:
        lines = self.lines
        if self.kind == "native":  # the signal line says more than the asterisks
            lines = [t for t in lines if not t.startswith("*** ***")]
        return Crash(self.kind, self.app, self.app_pid, tuple(lines), self.time)


class CrashDetector:
    """Feed every entry (with the app it was attributed to); get its mark, the app it belongs
    to, and the crashes that just ended."""

    def __init__(self) -> None:
        self._block: _Block | None = None
        # The last "Fatal signal" line (app, pid, time): the tombstone that follows it is
        # written by crash_dump, another process, and names the app only a few lines in.
        self._fatal: tuple[str | None, int, float] | None = None

    def observe(
        self, entry: LogEntry, app: str | None
    ) -> tuple[str | None, str | None, list[Crash]]:
        """(mark, app, crashes ended): ``app`` is the crashing app for lines of a crash block,
        else the one given."""
        ended: list[Crash] = []
        block = self._block
        if block is not None and not self._continues(block, entry):
            ended.append(block.report())
            block = self._block = None
        if block is None:
            block = self._start(entry, app)
            if block is None:
                died = _DIED.match(entry.message) if entry.tag == "ActivityManager" else None
                if died is not None:
                    return "died", died.group(1), ended
                if entry.tag == "libc" and entry.message.startswith("Fatal signal"):
                    self._fatal = (app, entry.pid, entry.sec + entry.nsec / 1e9)
                    return "native", app, ended  # the app's own first word; the tombstone follows
                return None, app, ended
            self._block = block
        block.take(entry)
        if block.entries >= _MAX_BLOCK:
            ended.append(block.report())
            self._block = None
        return block.kind, block.app or app, ended

    def flush(self) -> list[Crash]:
        """The stream went quiet: a block under way is over."""
        block, self._block = self._block, None
        return [] if block is None else [block.report()]

    def _start(self, entry: LogEntry, app: str | None) -> _Block | None:
        time = entry.sec + entry.nsec / 1e9
        message = entry.message
        if entry.tag == "AndroidRuntime" and message.startswith("FATAL EXCEPTION"):
            return _Block("java", entry.tag, entry.pid, time, app, entry.pid)
        if entry.tag == "DEBUG" and message.startswith(_TOMBSTONE_START):
            fatal, self._fatal = self._fatal, None
            if fatal is not None and time - fatal[2] <= _FATAL_TO_TOMBSTONE:
                return _Block("native", entry.tag, entry.pid, time, fatal[0], fatal[1])
            return _Block("native", entry.tag, entry.pid, time)
        if entry.tag == "ActivityManager":
            anr = _ANR.match(message)
            if anr is not None:
                return _Block("anr", entry.tag, entry.pid, time, anr.group(1))
        return None

    @staticmethod
    def _continues(block: _Block, entry: LogEntry) -> bool:
        if entry.tag != block.tag or entry.pid != block.pid:
            return False
        if block.kind == "anr":
            # ActivityManager goes on with other news; the ANR report is its error lines.
            return entry.level >= 6 and not _ANR.match(entry.message)
        if block.kind == "java":
            return not entry.message.startswith("FATAL EXCEPTION")
        return not entry.message.startswith(_TOMBSTONE_START)
