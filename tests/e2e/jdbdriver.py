"""An expect-style driver for the real ``jdb`` (peers.md: piping commands with sleeps garbles
jdb's output, because it prints asynchronously).

    async with open_jdb(jdb_path, port) as jdb:
        await jdb.attached()                          # "Initializing jdb ..." and a prompt
        await jdb.command(                            # the answer and an asynchronous event
            "stop at Prog:14", r"Set breakpoint Prog:14", r"Breakpoint hit:", r"line=14 bci"
        )
        text = await jdb.command("print n", r"\\bn = (\\d+)")
        await jdb.quit()

One background task reads jdb's stdout (stderr merged) into ``transcript``. jdb prints a
command's answer and event reports from different threads, so their texts interleave at any
print call ("Breakpoint hit: Set breakpoint Prog:14\\n> \"thread=main\", ..." is a real
transcript): patterns are therefore matched in any order, each one anywhere after the read
mark. ``expect`` waits for its patterns and moves the mark past the furthest match;
``command`` first moves the mark to the end, sends one line, waits for its patterns and then
for the prompt that follows the furthest one (``> `` or ``main[1] ``), and returns the text
from the command to that prompt. Every wait is bounded by ``patience`` seconds (per driver,
or per call with ``within=``); a timeout fails with the whole transcript in the message. On
exit from ``open_jdb`` a jdb that is still running is killed.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

__all__ = ["PROMPT", "THREAD_PROMPT", "Jdb", "JdbError", "open_jdb"]

# jdb's prompt: "> " (no current thread) or "THREAD[FRAME] ", at the start of a line, right
# after the previous prompt (``cont`` at "main[1] " prints "> " on the same line), or after
# "VM Started: " (a VM_START that suspended nothing is followed by the prompt alone).
PROMPT = re.compile(r"(?m)(?:^|(?<=\] )|(?<=VM Started: ))(?:> |[^\s\[\]][^\n\[\]]*\[\d+\] )")
# The prompt with a current thread ("main[1] "). After a breakpoint or step event jdb prints
# it last, once it has made the stopped thread current: only then do "print" and "where" work.
THREAD_PROMPT = re.compile(r"(?m)(?:^|(?<=\] ))[^\s\[\]>][^\n\[\]]*\[\d+\] ")

Pattern = str | re.Pattern[str]


class JdbError(AssertionError):
    """jdb did not print what was expected in time, or exited first. Carries the transcript."""


def _compile(pattern: Pattern) -> re.Pattern[str]:
    return pattern if isinstance(pattern, re.Pattern) else re.compile(pattern)


class Jdb:
    """One running jdb process. Create it with ``open_jdb``."""

    def __init__(self, process: trio.Process, *, patience: float, name: str) -> None:
        self.process = process
        self.patience = patience
        self.name = name
        self.transcript = ""
        self.mark = 0  # where the next expect starts looking
        self._changed = trio.Event()
        self._eof = False

    # ------------------------------------------------------------------ reading

    async def _read(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        try:
            while True:
                try:
                    data = await stdout.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                if not data:
                    return
                self.transcript += data.decode("utf-8", "replace")
                self._changed.set()
                self._changed = trio.Event()
        finally:
            self._eof = True
            self._changed.set()

    def _fail(self, what: str) -> JdbError:
        state = "exited" if self._eof else "still running"
        return JdbError(
            f"{self.name}: {what} ({state}, returncode={self.process.returncode});\n"
            f"--- transcript (read mark at {self.mark}) ---\n{self.transcript}\n--- end ---"
        )

    async def _wait_for(
        self, patterns: tuple[re.Pattern[str], ...], *, prompt: bool, within: float | None
    ) -> tuple[str, list[re.Match[str]]]:
        """Find every pattern after the mark (then a prompt after the furthest, if asked); move
        the mark past what was found."""
        limit = self.patience if within is None else within
        try:
            with trio.fail_after(limit):
                while True:
                    found = self._scan(patterns, prompt=prompt)
                    if found is not None:
                        end, matches = found
                        text = self.transcript[self.mark : end]
                        self.mark = end
                        return text, matches
                    if self._eof:
                        raise self._fail(f"output ended before {self._describe(patterns, prompt)}")
                    await self._changed.wait()
        except trio.TooSlowError:
            raise self._fail(f"no {self._describe(patterns, prompt)} within {limit:g} s") from None

    def _scan(
        self, patterns: tuple[re.Pattern[str], ...], *, prompt: bool
    ) -> tuple[int, list[re.Match[str]]] | None:
        pos = self.mark
        matches: list[re.Match[str]] = []
        for pattern in patterns:
            match = pattern.search(self.transcript, self.mark)
            if match is None:
                return None
            matches.append(match)
            pos = max(pos, match.end())
        if prompt:
            match = PROMPT.search(self.transcript, pos)
            if match is None:
                return None
            pos = match.end()
        return pos, matches

    @staticmethod
    def _describe(patterns: tuple[re.Pattern[str], ...], prompt: bool) -> str:
        parts = [repr(p.pattern) for p in patterns]
        if prompt:
            parts.append("a prompt")
        return " and ".join(parts)

    # ------------------------------------------------------------------ public API

    async def expect(self, *patterns: Pattern, within: float | None = None) -> list[re.Match[str]]:
        """Wait for every regex (in any order) after the mark; return the matches."""
        compiled = tuple(_compile(p) for p in patterns)
        _, matches = await self._wait_for(compiled, prompt=False, within=within)
        return matches

    async def prompt(self, *, within: float | None = None) -> str:
        """Wait for the next prompt after the mark; return the text up to and including it."""
        text, _ = await self._wait_for((), prompt=True, within=within)
        return text

    async def send(self, line: str) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        try:
            await stdin.send_all(line.encode() + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise self._fail(f"cannot send {line!r}: {exc}") from exc

    async def command(self, line: str, *patterns: Pattern, within: float | None = None) -> str:
        """Send ``line``; wait for ``patterns`` (in any order) and the prompt after them.

        Output printed before the command is skipped (the mark moves to the end first).
        Returns the text from the command to its prompt.
        """
        self.mark = len(self.transcript)
        await self.send(line)
        compiled = tuple(_compile(p) for p in patterns)
        text, _ = await self._wait_for(compiled, prompt=True, within=within)
        return text

    async def until_stopped(
        self, line: str, *patterns: Pattern, within: float | None = None
    ) -> str:
        """Send a command that lets a thread run until an event stops it (``stop at``,
        ``cont``, ``next``, ``step``): wait for ``patterns`` and for the thread prompt."""
        self.mark = len(self.transcript)
        await self.send(line)
        compiled = (*(_compile(p) for p in patterns), THREAD_PROMPT)
        text, _ = await self._wait_for(compiled, prompt=False, within=within)
        return text

    async def attached(self, *, within: float | None = None) -> str:
        """Wait until jdb has attached and shows its first prompt."""
        text, _ = await self._wait_for(
            (re.compile(r"Initializing jdb \.\.\."),), prompt=True, within=within
        )
        return text

    async def wait_exit(self, *, within: float | None = None) -> int:
        limit = self.patience if within is None else within
        try:
            with trio.fail_after(limit):
                return await self.process.wait()
        except trio.TooSlowError:
            raise self._fail(f"did not exit within {limit:g} s") from None

    async def quit(self, *, within: float | None = None) -> int:
        """``quit`` (VirtualMachine.Dispose, then close); returns jdb's exit status."""
        await self.send("quit")
        return await self.wait_exit(within=within)

    async def kill(self) -> None:
        """SIGKILL: jdb gets no chance to send Dispose; its socket just closes."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
        await self.wait_exit()


@asynccontextmanager
async def open_jdb(
    jdb: str,
    port: int,
    *,
    host: str = "127.0.0.1",
    sourcepath: str | None = None,
    patience: float = 10.0,
    name: str = "jdb",
) -> AsyncIterator[Jdb]:
    """Start ``jdb -attach HOST:PORT``; kill it on the way out if it still runs."""
    argv = [jdb]
    if sourcepath is not None:
        argv += ["-sourcepath", sourcepath]
    argv += ["-attach", f"{host}:{port}"]
    process = await trio.lowlevel.open_process(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    driver = Jdb(process, patience=patience, name=f"{name} -> {host}:{port}")
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(driver._read)
            try:
                yield driver
            finally:
                with trio.move_on_after(5) as cleanup:
                    cleanup.shield = True
                    if process.returncode is None:
                        process.send_signal(signal.SIGKILL)
                    await process.wait()
                    nursery.cancel_scope.deadline = trio.current_time() + 1
    finally:
        if process.returncode is None:  # the shielded wait above timed out
            process.kill()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                with trio.move_on_after(1) as scope:
                    scope.shield = True
                    await stream.aclose()
