"""``ddmd sysmon`` next to the daemon: the monitor is found by the port scan, its server-side
handler (``ddmd.sysmon.handler``, loaded through the ``ddmd.handlers`` entry point like any
plugin) decodes its reports, the API serves the figures, and ``ddmd clients`` says what it is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from ddmd.sysmon.client import SystemMonitor
from tests.actors.rawpeers import free_port_range, monitor, wait_until

CAP = 30
INTERVAL = 0.25


def loadavg() -> tuple[float, float, float]:
    one, five, fifteen = Path("/proc/loadavg").read_text().split()[:3]
    return float(one), float(five), float(fifteen)


def cpu_count() -> int:
    """CPUs listed in /proc/stat (the lines cpu0, cpu1, ...)."""
    lines = Path("/proc/stat").read_text().splitlines()
    return sum(1 for line in lines if line[:3] == "cpu" and line[3:4].isdigit())


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        out[key] = int(rest.split()[0])
    return out


async def test_the_api_serves_what_proc_says_and_clients_names_the_monitor(tmp_path):
    (port,) = free_port_range(1)
    sysmon = SystemMonitor(port=port, interval=INTERVAL)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            h.peers.start_soon(sysmon.serve)
            vm = f"tcp:{port}"

            async def figures(after: int = 0) -> dict[str, Any] | None:
                response = await h.client.get(f"/api/v1/vms/{vm}/ext")
                if response.status_code != 200:
                    return None
                value = response.json()["ext"].get("sysmon")
                if value and value["latest"]["timestamp_ms"] > after:
                    return value
                return None

            first = await wait_until(figures, 10, what="the monitor's first report")
            # Read /proc around a fresh report: the report was sampled between the two reads.
            before_load, before_mem = loadavg(), meminfo()
            latest = (
                await wait_until(
                    lambda: figures(first["latest"]["timestamp_ms"]), 10, what="a later report"
                )
            )["latest"]
            after_load, after_mem = loadavg(), meminfo()
            for i in range(3):
                low = min(before_load[i], after_load[i]) - 0.01
                high = max(before_load[i], after_load[i]) + 0.01
                assert low <= latest["load"][i] <= high, (i, latest["load"], before_load)
            assert latest["mem_total_kib"] == before_mem["MemTotal"] == after_mem["MemTotal"]
            slack = before_mem["MemTotal"] // 50  # 2 %: memory moves while the suite runs
            for key, name in (("mem_available_kib", "MemAvailable"), ("mem_free_kib", "MemFree")):
                low = min(before_mem[name], after_mem[name]) - slack
                high = max(before_mem[name], after_mem[name]) + slack
                assert low <= latest[key] <= high, (key, latest[key], before_mem[name])
            assert len(latest["cpu_busy"]) == cpu_count()
            assert first["kind"] == "system monitor"
            assert len(first["history"]) >= 1
            # `ddmd clients`: the monitor is a client of kind "system monitor", not a VM.
            result = await h.cli("clients")
            assert result.exit_code == 0, result.output
            header, *rows = result.output.splitlines()
            assert header.rstrip().endswith("KIND")
            (row,) = [r for r in rows if r.startswith(vm)]
            assert row.rstrip().endswith("system monitor")
            vms = await h.vms()
            assert [v["kind"] for v in vms if v["id"] == vm] == ["system monitor"]
            # Nothing to debug: a DDM client that is no VM gets no debugger port (issue 20).
            assert [v["debugger_port"] for v in vms if v["id"] == vm] == [None]
