"""Server-sent events on the wire: frames out (the daemon) and a line decoder in (`ddmd events`).

Layer: ``protocol`` (standard library only, sans-I/O); imported by `control.events` and
`control.logcat` (server side) and by `cli.events` and `cli.logcat` (which must stay light, so
they cannot import trio or starlette at start-up).

One event is ``event: NAME`` plus one ``data: JSON`` line and a blank line. The JSON is
written without newlines (``json.dumps`` escapes them inside strings), so one event is always
exactly one data line. Comments (``: keepalive``) and ``retry:`` lines carry no event.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SseDecoder", "SseEvent", "comment", "event_frame", "retry_frame"]


def event_frame(event: Mapping[str, Any]) -> bytes:
    """``event: NAME`` + ``data: JSON`` for one event dict (its "event" key names it)."""
    name = str(event.get("event") or "message")
    if "\n" in name or "\r" in name:
        raise ValueError(f"event name {name!r} contains a line break")
    data = json.dumps(event, separators=(",", ":"), default=str)
    return f"event: {name}\ndata: {data}\n\n".encode()


def comment(text: str) -> bytes:
    """A comment line (ignored by every client; keeps idle connections and proxies alive)."""
    return f": {' '.join(text.split())}\n\n".encode()


def retry_frame(milliseconds: int) -> bytes:
    """Tell an EventSource how long to wait before it reconnects."""
    return f"retry: {int(milliseconds)}\n\n".encode()


@dataclass(frozen=True, slots=True)
class SseEvent:
    name: str
    data: str


class SseDecoder:
    """Feed lines (without their line break); a blank line completes an event.

    Follows the HTML standard's parsing rules for the fields ddmd uses: ``event``, ``data``
    (several data lines are joined with newlines), comments start with ":", ``id`` and
    ``retry`` are ignored, a single space after the colon is dropped.
    """

    def __init__(self) -> None:
        self._name = ""
        self._data: list[str] = []

    def feed(self, line: str) -> SseEvent | None:
        if not line:
            if not self._data:
                self._name = ""
                return None
            event = SseEvent(self._name or "message", "\n".join(self._data))
            self._name, self._data = "", []
            return event
        if line.startswith(":"):
            return None
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._name = value
        elif field == "data":
            self._data.append(value)
        return None
