"""What a logcat viewer gets: attributed lines and restart separators, their filter, and the
bounded ring each device keeps.

Layer: standard library and ``ddmd.protocol`` only (sans-IO).
"""

from __future__ import annotations

import functools
import json
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ddmd.protocol.logcat import LogEntry, level_letter, parse_level

__all__ = ["Line", "LineFilter", "Restart", "Ring", "parse_since"]


@functools.lru_cache(maxsize=4096)
def _second(sec: int) -> str:
    """A second as ISO 8601 (UTC), formatted once (a busy log has thousands of lines in it)."""
    return datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S")


@dataclass(slots=True, eq=False)
class Line:
    """One log entry of a device, with the app it belongs to (None: a process ddmd does not
    know) and its crash mark ("java", "native", "anr", "died" or None)."""

    seq: int
    device: str
    entry: LogEntry
    app: str | None = None
    crash: str | None = None
    _text: str | None = None  # its JSON, made once for every viewer

    def json_text(self) -> str:
        """``to_json()`` as JSON text, encoded once however many viewers get it."""
        if self._text is None:
            self._text = json.dumps(self.to_json(), ensure_ascii=False, separators=(",", ":"))
        return self._text

    @property
    def time(self) -> float:
        return self.entry.sec + self.entry.nsec / 1e9

    def to_json(self) -> dict[str, Any]:
        e = self.entry
        stamp = _second(e.sec)
        return {
            "kind": "line",
            "seq": self.seq,
            "device": self.device,
            "time": f"{stamp}.{e.nsec // 1000:06d}Z",
            "pid": e.pid,
            "tid": e.tid,
            "level": level_letter(e.level),
            "tag": e.tag,
            "message": e.message,
            "app": self.app,
            "buffer": e.buffer_name,
            "crash": self.crash,
        }


@dataclass(slots=True, eq=False)
class Restart:
    """An app's process was replaced: the separator viewers of that app print."""

    seq: int
    device: str
    app: str
    old_pid: int
    new_pid: int
    time: float

    def text(self) -> str:
        return f"{self.app} restarted (pid {self.old_pid} \u2192 {self.new_pid})"

    def json_text(self) -> str:
        return json.dumps(self.to_json(), ensure_ascii=False, separators=(",", ":"))

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "restart",
            "seq": self.seq,
            "device": self.device,
            "app": self.app,
            "old_pid": self.old_pid,
            "new_pid": self.new_pid,
            "text": self.text(),
        }


Item = Line | Restart


def parse_since(text: str) -> tuple[str, float]:
    """``--since``: "5m", "30s", "2h" (a duration: ("seconds", n)) or "200" (the last lines:
    ("lines", n)). ValueError with the accepted forms otherwise."""
    value = text.strip().lower()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smh]?)", value)
    if match is None:
        raise ValueError(
            f"--since {text!r}: give a number of lines (200) or a duration (30s, 5m, 2h)"
        )
    number, unit = float(match.group(1)), match.group(2)
    if not unit:
        return "lines", number
    return "seconds", number * {"s": 1, "m": 60, "h": 3600}[unit]


@dataclass(frozen=True, slots=True)
class LineFilter:
    """Which items a viewer wants. ``app`` None: the whole device. Tags: any of ``tags`` if
    given, none of ``excluded``. ``grep`` searches the message and the tag."""

    app: str | None = None
    min_level: int = 0
    tags: frozenset[str] = frozenset()
    excluded: frozenset[str] = frozenset()
    grep: re.Pattern[str] | None = None

    @classmethod
    def parse(
        cls,
        *,
        app: str | None = None,
        level: str | None = None,
        tags: Sequence[str] = (),
        grep: str | None = None,
    ) -> LineFilter:
        """From user input; ValueError with a sentence naming the fix."""
        min_level = int(parse_level(level)) if level else 0
        wanted = frozenset(t for t in tags if t and not t.startswith("-"))
        excluded = frozenset(t[1:] for t in tags if t.startswith("-") and len(t) > 1)
        pattern = None
        if grep:
            try:
                pattern = re.compile(grep)
            except re.error as exc:
                raise ValueError(f"--grep {grep!r} is not a regular expression: {exc}") from None
        return cls(app, min_level, wanted, excluded, pattern)

    def matches(self, item: Item) -> bool:
        if isinstance(item, Restart):
            return self.app is None or item.app == self.app
        if self.app is not None and item.app != self.app:
            return False
        entry = item.entry
        if entry.level < self.min_level and item.crash is None:
            return False
        if self.tags and entry.tag not in self.tags:
            return False
        if entry.tag in self.excluded:
            return False
        return self.grep is None or bool(
            self.grep.search(entry.message) or self.grep.search(entry.tag)
        )


@dataclass
class Ring:
    """The last ``capacity`` items of one device, numbered from 1 as they came."""

    capacity: int
    items: deque[Item] = field(init=False)
    next_seq: int = 1

    def __post_init__(self) -> None:
        self.items = deque(maxlen=max(1, self.capacity))

    def take(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def add(self, items: Iterable[Item]) -> None:
        self.items.extend(items)

    def select(
        self,
        wanted: LineFilter,
        *,
        after: int = 0,
        last: int | None = None,
        since_time: float | None = None,
    ) -> list[Item]:
        """Items matching ``wanted``: newer than seq ``after``, from ``since_time`` (the
        device's clock), the ``last`` N of them."""
        out = [
            item
            for item in self.items
            if item.seq > after
            and (since_time is None or item.time >= since_time)
            and wanted.matches(item)
        ]
        return out if last is None else out[-last:] if last else []

    def newest_time(self) -> float | None:
        return self.items[-1].time if self.items else None
