"""A VM that can only write traces and heap dumps to a file on its device (an older VM: its
FEAT lacks the streaming features): ddmd asks it to write to /sdcard, fetches the file through
adb (adbutils' sync pull, against the fake adb server) and removes it from the device."""

from __future__ import annotations

import trio

from ddmd.protocol.hprof import summarise_file
from ddmd.protocol.trace import parse_trace
from tests.adb.fakeadb import adb_rig

CAP = 30
FILE_ONLY = ("method-trace-profiling", "hprof-heap-dump")


async def test_a_trace_and_a_dump_written_on_the_device_are_fetched_and_removed(tmp_path):
    with trio.fail_after(CAP):
        async with adb_rig(tmp_path, desk=False) as rig:
            sim = await rig.device_sim(3131, "com.example.old", features=FILE_ONLY)
            device = rig.plug("old-phone", {3131: sim})
            device.files = sim.device_files  # what the sim writes "on the device"
            vm = "old-phone/3131"
            await rig.wait_ready(vm)
            client = rig.h.client
            offer = (await client.get(f"/api/v1/vms/{vm}/profiling")).json()["features"]
            assert offer["trace"]["modes"] == ["file"]
            assert offer["hprof"]["mode"] == "file"

            started = await client.post(f"/api/v1/vms/{vm}/trace/start")
            assert started.json() == {"trace": "method", "mode": "file"}, started.text
            stopped = await client.post(f"/api/v1/vms/{vm}/trace/stop")
            assert stopped.status_code == 200, stopped.text
            body = stopped.json()
            path = tmp_path / "captures" / body["file"]
            profile = parse_trace(path.read_bytes())
            assert profile.records > 0
            assert not sim.device_files, "the trace was not removed from the device"

            dumped = await client.post(f"/api/v1/vms/{vm}/hprof")
            assert dumped.status_code == 200, dumped.text
            dump = tmp_path / "captures" / dumped.json()["file"]
            assert summarise_file(dump).instances > 0
            assert not sim.device_files, "the heap dump was not removed from the device"
            assert any(r.startswith("old-phone:sync:") for r in rig.fake.requests)
            removed = [r for r in rig.fake.requests if r.startswith("old-phone:shell:rm -f ")]
            assert [r.rsplit(".", 1)[1] for r in removed] == ["trace", "hprof"]
            assert all(" /sdcard/com.example.old-" in r for r in removed)
