"""Reading /proc for the system monitor: the parsers on fixed text, on this machine's files
(compared with the same files read here), and `Sampler` on a fake /proc with fake clocks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddmd.sysmon.proc import (
    CpuTimes,
    Sampler,
    busy_shares,
    parse_loadavg,
    parse_meminfo,
    parse_stat,
)
from tests.actors.needs import IN_CI

PROC = Path("/proc")
linux_only = pytest.mark.skipif(
    not (PROC / "loadavg").exists() and not IN_CI,
    reason="needs Linux's /proc (loadavg, meminfo, stat)",
)

MEMINFO = """\
MemTotal:       24683656 kB
MemFree:        23763956 kB
MemAvailable:   24109488 kB
SwapTotal:       2097148 kB
SwapFree:        1048576 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
nonsense line
Broken:        x kB
"""

STAT = """\
cpu  700 10 300 9000 100 0 50 0 0 0
cpu0 400 10 200 4000 50 0 30 0 0 0
cpu2 300 0 100 5000 50 0 20 0 7 7
cpu3 1 2
cpuX 1 2 3 4 5
intr 100 0 0
ctxt 12345
"""


def test_parse_loadavg() -> None:
    assert parse_loadavg("1.02 0.72 0.69 3/89 26416\n") == (1.02, 0.72, 0.69)
    for bad in ("", "1.0 2.0", "a b c 1/2 3", "1.0 -2.0 3.0 1/2 3"):
        with pytest.raises(ValueError, match="/proc/loadavg"):
            parse_loadavg(bad)


def test_parse_meminfo() -> None:
    info = parse_meminfo(MEMINFO)
    assert info == {
        "MemTotal": 24683656,
        "MemFree": 23763956,
        "MemAvailable": 24109488,
        "SwapTotal": 2097148,
        "SwapFree": 1048576,
        "HugePages_Total": 0,
        "Hugepagesize": 2048,
    }


def test_parse_stat_and_busy_shares() -> None:
    cpus = parse_stat(STAT)
    # cpu1 is offline (no line); the "cpu" total, "cpu3" (too short) and "cpuX" are left out.
    assert cpus == {
        0: CpuTimes(total=400 + 10 + 200 + 4000 + 50 + 30, idle=4000 + 50),
        2: CpuTimes(total=300 + 100 + 5000 + 50 + 20, idle=5000 + 50),
    }
    later = {
        0: CpuTimes(total=cpus[0].total + 100, idle=cpus[0].idle + 75),  # 25 of 100 busy
        1: CpuTimes(total=50, idle=50),  # came online: nothing to compare with
        2: CpuTimes(total=cpus[2].total, idle=cpus[2].idle),  # no tick passed
    }
    assert busy_shares(cpus, later) == (0.25, None, None)
    went_back = {0: CpuTimes(total=cpus[0].total + 10, idle=cpus[0].idle + 20)}
    assert busy_shares(cpus, went_back) == (None,)
    # Old kernels: only the first four fields.
    assert parse_stat("cpu0 10 20 30 40\n") == {0: CpuTimes(total=100, idle=40)}


@linux_only
def test_the_parsers_read_this_machines_files_as_they_are() -> None:
    text = (PROC / "loadavg").read_text()
    assert parse_loadavg(text) == tuple(float(f) for f in text.split()[:3])

    text = (PROC / "meminfo").read_text()
    expected = {
        m.group(1): int(m.group(2)) for m in re.finditer(r"^([^:\s]+):\s+(\d+)", text, re.M)
    }
    info = parse_meminfo(text)
    assert info == expected
    for key in ("MemTotal", "MemFree", "MemAvailable", "SwapTotal", "SwapFree"):
        assert key in info, key

    text = (PROC / "stat").read_text()
    lines = {
        int(m.group(1)): [int(x) for x in m.group(2).split()]
        for m in re.finditer(r"^cpu(\d+) (.*)$", text, re.M)
    }
    cpus = parse_stat(text)
    assert sorted(cpus) == sorted(lines)
    for number, fields in lines.items():
        assert cpus[number].total == sum(fields[:8])
        assert cpus[number].idle == fields[3] + fields[4]


def fake_proc(root: Path, *, loadavg: str, meminfo: str, stat: str) -> Path:
    for name, text in (("loadavg", loadavg), ("meminfo", meminfo), ("stat", stat)):
        (root / name).write_text(text)
    return root


def test_sampler_on_a_fake_proc(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, loadavg="0.50 1.25 2.00 1/2 3\n", meminfo=MEMINFO, stat=STAT)
    clock = {"wall": 1_700_000_000.5, "mono": 100.0}
    sampler = Sampler(proc, wall=lambda: clock["wall"], monotonic=lambda: clock["mono"])
    # 2.5 s later: cpu0 spent 30 of 120 ticks busy, cpu2 60 of 60, cpu1 came online.
    proc.joinpath("stat").write_text(
        "cpu  0 0 0 0 0 0 0 0 0 0\n"
        "cpu0 420 10 210 4080 60 0 30 0 0 0\n"
        "cpu1 5 0 5 10 0 0 0 0 0 0\n"
        "cpu2 340 0 120 5000 50 0 20 0 0 0\n"
    )
    clock["mono"] += 2.5
    report = sampler.report()
    assert report.timestamp_ms == 1_700_000_000_500
    assert (report.load1, report.load5, report.load15) == (500, 1250, 2000)
    assert (report.mem_total, report.mem_available, report.mem_free) == (
        24683656,
        24109488,
        23763956,
    )
    assert (report.swap_total, report.swap_free) == (2097148, 1048576)
    assert report.cpu_period_ms == 2500
    assert report.cpu_busy == (250, None, 1000)
    # The next report covers the time since this one.
    clock["mono"] += 1.0
    again = sampler.report()
    assert again.cpu_period_ms == 1000
    assert again.cpu_busy == (None, None, None)  # no tick passed
    # A kernel without MemAvailable: not reported.
    proc.joinpath("meminfo").write_text("MemTotal: 100 kB\nMemFree: 50 kB\n")
    older = sampler.report()
    assert (older.mem_total, older.mem_free, older.mem_available, older.swap_total) == (
        100,
        50,
        None,
        None,
    )


def test_sampler_errors(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, loadavg="garbage\n", meminfo=MEMINFO, stat=STAT)
    sampler = Sampler(proc)
    with pytest.raises(ValueError, match="/proc/loadavg"):
        sampler.report()
    proc.joinpath("loadavg").unlink()
    with pytest.raises(OSError):
        sampler.report()


@linux_only
def test_a_report_of_this_machine_agrees_with_proc() -> None:
    sampler = Sampler()
    before_load = parse_loadavg((PROC / "loadavg").read_text())
    before_mem = parse_meminfo((PROC / "meminfo").read_text())
    report = sampler.report()
    after_load = parse_loadavg((PROC / "loadavg").read_text())
    after_mem = parse_meminfo((PROC / "meminfo").read_text())
    cpus = parse_stat((PROC / "stat").read_text())

    # Load averages change at most once between the two reads: the report has one of them.
    for got, before, after in zip(
        (report.load1, report.load5, report.load15), before_load, after_load, strict=True
    ):
        assert got in (round(before * 1000), round(after * 1000))
    assert report.mem_total == before_mem["MemTotal"] == after_mem["MemTotal"]
    assert report.swap_total == before_mem["SwapTotal"] == after_mem["SwapTotal"]
    slack = 64 * 1024  # KiB: memory use moves a little between the reads
    for name, key in (("mem_available", "MemAvailable"), ("mem_free", "MemFree")):
        value = getattr(report, name)
        low = min(before_mem[key], after_mem[key]) - slack
        high = max(before_mem[key], after_mem[key]) + slack
        assert low <= value <= high, (name, value, before_mem[key], after_mem[key])
    assert len(report.cpu_busy) == len(cpus)
    for busy in report.cpu_busy:
        assert busy is None or 0 <= busy <= 1000
