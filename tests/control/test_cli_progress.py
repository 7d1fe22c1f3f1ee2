"""Issue 20, friction 10: progress on long work. On a terminal, `hprof` and `trace` show the
download's bytes and MiB/s, `trace --seconds` counts down, a heap dump shows the time it has
taken; without a terminal nothing of it is written. A refusal comes before the "dumping..."
line. The terminal is a fake one (`FakeTty`); the daemon is test_cli_ddms's fake daemon."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import trio

from ddmd.cli import profiling
from ddmd.cli.profiling import hprof, trace
from ddmd.cli.progress import (
    REDRAW_INTERVAL,
    Transfer,
    countdown,
    countdown_line,
    elapsed_line,
    ticking,
    transfer_line,
)
from tests.control.test_cli_ddms import (  # the fake daemon and its fixtures
    HPROF_NAME,
    MAIL,
    NO_HPROF,
    daemon,
    invoke,
    no_user_config,
)

__all__ = ["daemon", "no_user_config"]  # fixtures used here by name

MIB = 1024 * 1024


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True

    def lines(self) -> list[str]:
        """What was drawn, one entry per redraw (erasing draws give "")."""
        return [part.removesuffix("\x1b[K") for part in self.getvalue().split("\r") if part]


# ------------------------------------------------------------------------------ the lines


def test_transfer_line_shows_bytes_share_and_mib_per_second():
    line = transfer_line("downloading x.hprof", 512 * MIB, 1536 * MIB, 12.4)
    assert line == "downloading x.hprof: 512.0 MiB of 1.50 GiB (33 %), 41.3 MiB/s"
    assert transfer_line("downloading x", 2048, None, 0.0) == "downloading x: 2.0 KiB"
    assert countdown_line("tracing", 6.2) == "tracing: 7 s left (Ctrl-C stops it now)"
    assert elapsed_line("dumping the heap of mail", 65.9) == "dumping the heap of mail... 1:05"


def test_transfer_redraws_in_place_at_most_every_interval_and_erases_itself():
    tty = FakeTty()
    now = [0.0]
    progress = Transfer("downloading x.hprof", 100 * MIB, tty, clock=lambda: now[0])
    for step in range(1, 11):
        now[0] = step * 0.125  # a piece every 1/8 s: a redraw every other piece
        progress.update(step * 10 * MIB)
    progress.finish()
    drawn = tty.lines()
    assert drawn[-1] == ""  # erased at the end: the next line starts clean
    shown = drawn[:-1]
    assert 0.125 < REDRAW_INTERVAL <= 0.25
    assert len(shown) == 5  # ten pieces, a redraw every other one
    assert shown[0] == "downloading x.hprof: 10.0 MiB of 100.0 MiB (10 %), 80.0 MiB/s"
    assert shown[-1] == "downloading x.hprof: 90.0 MiB of 100.0 MiB (90 %), 80.0 MiB/s"
    assert all(tty.getvalue().count(s) for s in ("\r", "\x1b[K"))


def test_no_terminal_no_progress():
    progress = Transfer("downloading x", 10, None)
    progress.update(5)
    progress.finish()  # nothing to write to, nothing written


async def test_countdown_shows_the_seconds_left(autojump_clock):
    tty = FakeTty()
    start = trio.current_time()
    await countdown("tracing", 3, tty)
    assert trio.current_time() - start == pytest.approx(3)
    drawn = tty.lines()
    assert [line.split(": ")[1].split(" s")[0] for line in drawn[:-1]] == ["3", "2", "1"]
    assert drawn[-1] == ""


async def test_countdown_without_a_terminal_only_waits(autojump_clock):
    start = trio.current_time()
    await countdown("tracing", 2.5, None)
    assert trio.current_time() - start == pytest.approx(2.5)


async def test_a_wait_shows_the_time_it_has_taken(autojump_clock):
    tty = FakeTty()
    async with ticking("dumping the heap of mail", tty):
        await trio.sleep(2.5)
    assert tty.lines() == [
        "dumping the heap of mail... 0:00",
        "dumping the heap of mail... 0:01",
        "dumping the heap of mail... 0:02",
        "",
    ]


# ------------------------------------------------------------------------------ the commands


@pytest.fixture
def tty(monkeypatch) -> FakeTty:
    fake = FakeTty()
    monkeypatch.setattr(profiling, "terminal", lambda: fake)
    return fake


def test_hprof_on_a_terminal_shows_the_download(daemon, tty):
    result = invoke(hprof, MAIL)
    assert result.exit_code == 0, result.output
    drawn = tty.lines()
    assert drawn[0] == f"dumping the heap of {MAIL} (tcp:8000, pid 3101)... 0:00"
    downloads = [line for line in drawn if line.startswith(f"downloading {HPROF_NAME}: ")]
    assert downloads
    assert f"of {len(daemon.hprof_bytes) / 1024:.1f} KiB" in downloads[0]
    assert downloads[0].endswith("MiB/s")
    assert drawn[-1] == ""
    # The lines printed without a terminal are not repeated: the ticker replaces them.
    assert "dumping" not in result.stderr
    assert f"wrote {HPROF_NAME}" in result.stdout


def test_trace_seconds_counts_down_on_a_terminal(daemon, tty):
    result = invoke(trace, MAIL, "--seconds", "0.01")
    assert result.exit_code == 0, result.output
    drawn = tty.lines()
    assert "tracing: 1 s left (Ctrl-C stops it now)" in drawn
    assert any(line.startswith("downloading ") and "MiB/s" in line for line in drawn)
    assert f"tracing {MAIL} (tcp:8000, pid 3101) for 0.01 s" in result.stderr


def test_without_a_terminal_the_output_has_no_progress(daemon):
    result = invoke(hprof, MAIL)
    assert result.exit_code == 0, result.output
    assert "\r" not in result.stderr + result.stdout
    assert result.stderr == f"dumping the heap of {MAIL} (tcp:8000, pid 3101)...\n"


def test_a_refusal_comes_before_the_dumping_line(daemon):
    result = invoke(hprof, "maps")
    assert result.exit_code == 1
    assert result.stderr == f"ddmd hprof: {NO_HPROF}\n"  # and no "dumping..." before it
    assert not [p for p in daemon.paths() if p.endswith("/hprof")]
    assert list(Path.cwd().iterdir()) == []
