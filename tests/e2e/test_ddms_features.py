"""Method tracing, HPROF dumps, the allocation tracker and kill, taken through a running ddmd
from simulated VMs and judged by the real tools: Debian's ``dmtracedump`` reads the trace,
``hprof-conv`` converts the dump, and ``ddmd hprof-summary`` counts what the sim recorded; a
real ``jdb`` attached through ddmd sees the connection close when the app is killed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from ddmd.control.profiling import _descriptor_name
from tests.actors.rawpeers import free_port_range, monitor
from tests.e2e.test_bridge_jvm import WAIT, jdb_session, vm_id
from tests.hprof.test_sim_dump import counts_of, hprof_conv, summary_json
from tests.trace import dmtrace

pytestmark = pytest.mark.jvm

CAP = 60


async def ready(h: Any, port: int, **sim: Any) -> tuple[Any, str]:
    vm = await h.start_sim(port, threads=6, **sim)
    await h.wait_vm(vm_id(port), lambda v: v["state"] == "ready", timeout=WAIT)
    return vm, vm_id(port)


async def download(h: Any, body: dict[str, Any], tmp_path: Path) -> Path:
    response = await h.client.get(body["download"])
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    path = tmp_path / body["file"]
    path.write_bytes(response.content)
    assert path.stat().st_size == body["bytes"]
    return path


async def test_a_trace_through_ddmd_is_read_by_dmtracedump_with_the_sim_s_calls(tmp_path):
    tool = dmtrace.require_dmtracedump()
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            sim, vm = await ready(h, port)
            started = await h.client.post(f"/api/v1/vms/{vm}/trace/start")
            assert started.json() == {"trace": "method", "mode": "streaming"}, started.text
            state = await h.client.get(f"/api/v1/vms/{vm}/trace")
            assert state.json() == {"trace": "method"}
            stopped = await h.client.post(f"/api/v1/vms/{vm}/trace/stop")
            assert stopped.status_code == 200, stopped.text
            body = stopped.json()
            assert body["file"].startswith("com.example.sim-")
            assert body["file"].endswith(".trace")
            path = await download(h, body, tmp_path)
            expected = sim.trace_recording().call_counts()
    # The real dmtracedump reads it and lists every method the sim recorded, with its calls.
    with trio.fail_after(60):
        result = await trio.run_process([tool, str(path)], capture_stdout=True, check=False)
    assert result.returncode == 0, result.stderr
    shown = dmtrace.profile(result.stdout.decode())
    assert {n: c + r for n, (c, r) in shown.calls.items()} == expected
    # ddmd's own report (sent with the stop) agrees on the call counts.
    report = body["report"]
    calls = {m["method"]: m["calls"] for m in report["all_threads"]["by_inclusive"]}
    assert {n: calls[n] for n in expected if n in calls} == {
        n: c for n, c in expected.items() if n in calls
    }
    assert len(calls) == min(len(expected), 20)


async def test_a_heap_dump_through_ddmd_converts_and_counts_what_the_sim_holds(tmp_path):
    converter = hprof_conv()
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            sim, vm = await ready(h, port)
            response = await h.client.post(f"/api/v1/vms/{vm}/hprof")
            assert response.status_code == 200, response.text
            body = response.json()
            path = await download(h, body, tmp_path)
            expected = sim.heap_content().expected_instances()
    assert body["histogram"]["format"] == "JAVA PROFILE 1.0.3"
    converted = tmp_path / "converted.hprof"
    with trio.fail_after(60):
        result = await trio.run_process(
            [converter, str(path), str(converted)], capture_stderr=True, check=False
        )
    assert result.returncode == 0, result.stderr
    assert counts_of(summary_json(path)) == expected
    assert counts_of(summary_json(converted)) == expected


async def test_the_allocation_list_is_exactly_what_the_sim_recorded(tmp_path):
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            sim, vm = await ready(h, port)
            assert (await h.client.get(f"/api/v1/vms/{vm}/allocs")).json()["enabled"] is False
            started = await h.client.post(f"/api/v1/vms/{vm}/allocs/start")
            assert started.json() == {"enabled": True}, started.text
            listing = (await h.client.get(f"/api/v1/vms/{vm}/allocs?top=0")).json()
            recorded = sim.recorded_allocations()
            stopped = await h.client.post(f"/api/v1/vms/{vm}/allocs/stop")
            assert stopped.json() == {"enabled": False}
    assert recorded
    assert listing["allocations"] == [
        {
            "size": a.size,
            "class": _descriptor_name(a.class_name),
            "thread": a.thread_id,
            "frames": [
                {
                    "class": _descriptor_name(f.class_name),
                    "method": f.method_name,
                    "file": f.file_name,
                    "line": f.line,
                }
                for f in a.frames
            ],
        }
        for a in recorded
    ]
    by_class = {row["class"]: (row["count"], row["bytes"]) for row in listing["by_class"]}
    for a in recorded:
        assert _descriptor_name(a.class_name) in by_class
    assert sum(c for c, _ in by_class.values()) == len(recorded)
    assert sum(b for _, b in by_class.values()) == sum(a.size for a in recorded)


async def test_android_12_says_what_it_lacks_in_words(tmp_path):
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path, timeouts={"capture": 1.0}) as h:
            _, vm = await ready(h, port, flavor="modern")
            await h.wait_vm(vm, lambda v: "HPIF" in v["unsupported"], timeout=WAIT)
            offer = (await h.client.get(f"/api/v1/vms/{vm}/profiling")).json()["features"]
            assert offer["allocs"]["available"] is False
            assert "Android 12 removed the allocation tracker" in offer["allocs"]["reason"]
            assert offer["trace"]["available"] is True
            refused = await h.client.post(f"/api/v1/vms/{vm}/allocs/start")
            assert refused.status_code == 501
            assert "allocation tracker" in refused.json()["error"]
            assert "REAE" not in refused.json()["error"]
            # The heap dump handlers went with the heap info ones: refused at once, in words.
            assert offer["hprof"]["available"] is False
            assert "heap dumps" in offer["hprof"]["reason"]
            dump = await h.client.post(f"/api/v1/vms/{vm}/hprof")
            assert dump.status_code == 501, dump.text
            assert "Android 12" in dump.json()["error"]


async def test_kill_ends_the_vm_and_its_debugger_sees_the_connection_close(jdk, tmp_path):
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            sim, vm = await ready(h, port)
            snapshot = await h.vm(vm)
            assert snapshot is not None
            async with jdb_session(jdk, snapshot["debugger_port"], "K") as jdb:
                await jdb.attached()
                response = await h.client.post(f"/api/v1/vms/{vm}/kill?status=7")
                assert response.json() == {"killed": vm, "status": 7}, response.text
                assert await jdb.wait_exit() is not None
                assert "disconnected" in jdb.transcript or "application exited" in (
                    jdb.transcript.lower()
                )
            requested = await h.wait_event("vm.kill_requested", vm=vm)
            assert requested["requester"].startswith("127.0.0.1:")
            assert requested["status"] == 7
            await h.wait_event("vm.disconnected", vm=vm, timeout=WAIT)
            assert sim.exit_status == 7
