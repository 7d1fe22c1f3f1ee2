"""Progress on long work, on a terminal: a download's bytes and MiB/s, a countdown, the time a
wait has taken. One line on stderr, redrawn in place (carriage return, erase to the end of the
line) and erased when the work ends; nothing at all when stderr is not a terminal, so pipes,
files and scripts get only the lines the commands always print.

Layer: the standard library, click (the terminal), trio lazily (the tickers run inside the
command's trio run). The lines are pure functions (`transfer_line`, `countdown_line`,
`elapsed_line`) so tests check them without a terminal; `terminal()` is the seam tests replace
with a fake one.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TextIO

import click

__all__ = [
    "REDRAW_INTERVAL",
    "Line",
    "Transfer",
    "countdown",
    "countdown_line",
    "elapsed_line",
    "terminal",
    "ticking",
    "transfer_line",
]

#: Seconds between two redraws of a transfer line (a download calls `Transfer.update` for
#: every piece; the terminal needs far fewer lines).
REDRAW_INTERVAL = 0.2
_MIB = 1024 * 1024


def terminal() -> TextIO | None:
    """stderr when it is a terminal, else None (then no progress is shown)."""
    stream = sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return None
    return stream if tty else None


def _amount(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < _MIB:
        return f"{n / 1024:.1f} KiB"
    if n < 1024 * _MIB:
        return f"{n / _MIB:.1f} MiB"
    return f"{n / (1024 * _MIB):.2f} GiB"


def transfer_line(what: str, done: int, total: int | None, seconds: float) -> str:
    """``downloading x.hprof: 512.0 MiB of 1.50 GiB (33 %), 41.3 MiB/s``."""
    text = f"{what}: {_amount(done)}"
    if total:
        text += f" of {_amount(total)} ({100 * done // total} %)"
    if seconds > 0:
        text += f", {done / seconds / _MIB:.1f} MiB/s"
    return text


def countdown_line(what: str, left: float) -> str:
    """``tracing com.example.mail: 7 s left (Ctrl-C stops it now)``; whole seconds, rounded up."""
    return f"{what}: {max(0, math.ceil(left))} s left (Ctrl-C stops it now)"


def elapsed_line(what: str, seconds: float) -> str:
    """``dumping the heap of com.example.mail... 1:05``."""
    whole = int(seconds)
    return f"{what}... {whole // 60}:{whole % 60:02d}"


class Line:
    """One line redrawn in place on ``stream`` (a terminal), erased by `clear`."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._shown = False

    def draw(self, text: str) -> None:
        self._stream.write(f"\r{text}\x1b[K")
        self._stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
            self._shown = False


class Transfer:
    """Bytes and MiB/s of a download, redrawn at most every `REDRAW_INTERVAL` seconds; does
    nothing when ``stream`` is None (not a terminal)."""

    def __init__(
        self,
        what: str,
        total: int | None,
        stream: TextIO | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._what = what
        self._total = total
        self._line = None if stream is None else Line(stream)
        self._clock = clock
        self._start = clock()
        self._drawn_at: float | None = None

    def update(self, done: int) -> None:
        if self._line is None:
            return
        now = self._clock()
        if self._drawn_at is not None and now - self._drawn_at < REDRAW_INTERVAL:
            return
        self._drawn_at = now
        self._line.draw(transfer_line(self._what, done, self._total, now - self._start))

    def finish(self) -> None:
        if self._line is not None:
            self._line.clear()


async def countdown(what: str, seconds: float, stream: TextIO | None) -> None:
    """Sleep ``seconds``, showing the seconds left once a second on a terminal."""
    import trio

    deadline = trio.current_time() + seconds
    if stream is None:
        await trio.sleep_until(deadline)
        return
    line = Line(stream)
    try:
        while (left := deadline - trio.current_time()) > 0:
            line.draw(countdown_line(what, left))
            # Wake when the shown number changes: on the whole second, or at the end.
            step = left - math.floor(left) or 1.0
            await trio.sleep(min(step, left))
    finally:
        line.clear()


@asynccontextmanager
async def ticking(what: str, stream: TextIO | None) -> AsyncIterator[None]:
    """While the body runs: ``what...`` and the time taken so far, once a second, on a
    terminal; otherwise the line ``what...`` once."""
    import trio

    if stream is None:
        click.echo(f"{what}...", err=True)
        yield
        return
    line = Line(stream)
    start = trio.current_time()

    async def tick() -> None:
        while True:
            line.draw(elapsed_line(what, trio.current_time() - start))
            await trio.sleep(1.0)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tick)
            try:
                yield
            finally:
                nursery.cancel_scope.cancel()
    finally:
        line.clear()
