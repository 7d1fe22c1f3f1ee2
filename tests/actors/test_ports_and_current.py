"""The real daemon with simulated VMs: the current VM follows a VM named after it was chosen,
and the port book is cleaned at start and edited through the control API and `ddmd ports`.

Every test has an absolute ``fail_after`` cap; conditions are polled with ``wait_until``.
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

import trio
from click.testing import CliRunner

from ddmd.cli import main
from ddmd.portbook import format_time
from tests.actors.rawpeers import free_port_range, monitor, wait_until

CAP = 15  # seconds: absolute cap on every test
DAY = 86400.0


async def test_waiting_vm_stays_current_when_it_gets_its_name(tmp_path: Path) -> None:
    quiet, waiting = free_port_range(2)
    with trio.fail_after(CAP):
        async with monitor([quiet, waiting], tmp_path, scan={"interval": 0.05}) as h:
            await h.start_sim(quiet, pid=1001, app_name="org.quiet", package_name="org.quiet")
            await h.wait_vm(f"tcp:{quiet}", lambda v: v["app"] == "org.quiet")
            # Reports WAIT while still <pre-initialized>; APNM names it 0.5 s later.
            await h.start_sim(
                waiting,
                pid=1002,
                app_name="com.example.late",
                package_name="com.example.late",
                wait_for_debugger=True,
                apnm_delay=0.5,
            )
            await h.wait_event("vm.waiting_for_debugger", vm=f"tcp:{waiting}")
            response = await h.client.get("/api/v1/current")
            assert response.json()["vm"]["id"] == f"tcp:{waiting}"

            await h.wait_vm(f"tcp:{waiting}", lambda v: v["app"] == "com.example.late")
            body = (await h.client.get("/api/v1/current")).json()
            assert body["vm"] is not None, body
            assert body["vm"]["id"] == f"tcp:{waiting}"
            assert body["selected"] == "local|com.example.late"
            # It never stopped being current on the way.
            changes = [e["vm"] for e in h.events("current.changed")]
            assert changes[-1] == f"tcp:{waiting}"
            assert None not in changes[changes.index(f"tcp:{waiting}") :]


async def test_port_book_cleaned_at_start_and_edited_through_the_api(tmp_path: Path) -> None:
    (scan,) = free_port_range(1)
    while True:  # the daemon's own ports, chosen here so the state file can name them
        own = free_port_range(6)
        if scan not in own:
            break
    control, current, dbg = own[0], own[1], own[2:]
    sections = {
        "control": {"port": control},
        "debugger": {"current_port": current, "ports": f"{dbg[0]}-{dbg[-1]}"},
    }
    now = time.time()
    state = tmp_path / "ports.json"
    state.write_text(
        json.dumps(
            {
                "version": 1,
                "ports": {
                    "local|com.example.stale": dbg[1],
                    "local|com.example.idle": dbg[2],
                    "local|com.example.old-format": dbg[3],
                },
                "last_seen": {
                    "local|com.example.stale": format_time(now - 45 * DAY),
                    "local|com.example.idle": format_time(now - 2 * DAY),
                },
            }
        )
    )

    def on_disk() -> dict[str, int]:
        return dict(json.loads(state.read_text())["ports"])

    with trio.fail_after(CAP):
        async with monitor([scan], tmp_path, **sections) as h:
            # Dropped at start (older than forget_after_days = 30), and the file rewritten.
            forgotten = await h.wait_event("ports.forgotten")
            assert forgotten["key"] == "local|com.example.stale"
            assert forgotten["port"] == dbg[1]
            await wait_until(
                lambda: "local|com.example.stale" not in on_disk(), 5, what="file rewritten"
            )
            assert len(h.events("ports.forgotten")) == 1

            await h.start_sim(scan, pid=2024, app_name="com.example.sim")
            vm = await h.wait_vm(f"tcp:{scan}", lambda v: v["debugger_port"] is not None)
            assert vm["debugger_port"] == dbg[0]  # the free port: the others are reserved

            body = (await h.client.get("/api/v1/ports")).json()
            assert body["path"] == str(state)
            listed = {e["key"]: e for e in body["ports"]}
            assert set(listed) == {
                "local|com.example.idle",
                "local|com.example.old-format",
                "local|com.example.sim",
            }
            assert listed["local|com.example.sim"]["in_use"] is True
            assert listed["local|com.example.sim"]["vm"] == f"tcp:{scan}"
            assert listed["local|com.example.idle"]["in_use"] is False

            # The connected app's port cannot be forgotten; an idle one can.
            response = await h.client.delete("/api/v1/ports/com.example.sim")
            assert response.status_code == 409
            assert "connected now" in response.json()["error"]
            result = await h.cli("ports", "--forget", "com.example.idle")
            assert result.exit_code == 0, result.output
            await wait_until(
                lambda: "local|com.example.idle" not in on_disk(), 5, what="entry forgotten"
            )
            result = await h.cli("ports")
            assert result.exit_code == 0, result.output
            sim_line = next(
                line for line in result.stdout.splitlines() if "com.example.sim" in line
            )
            assert sim_line.endswith(f"yes (tcp:{scan})")
            assert "com.example.idle" not in result.stdout

    # With the daemon gone, `ddmd ports` reads the file itself.
    config = tmp_path / "offline.toml"
    config.write_text(f'[debugger]\nstate_file = "{state}"\n')
    argv = ["ports", "--config", str(config), "--control", f"127.0.0.1:{control}"]
    result = await trio.to_thread.run_sync(partial(CliRunner().invoke, main, argv))
    assert result.exit_code == 0, result.output
    assert "no daemon answers" in result.stdout
    assert "com.example.sim" in result.stdout
