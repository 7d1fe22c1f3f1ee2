"""``GET .../stacks`` for a VM that speaks DDM: one STKL per thread of its thread list, through
a real daemon and a simulated VM (its stacks are known to the sim)."""

from __future__ import annotations

import trio

from tests.actors.rawpeers import free_port_range, monitor

CAP = 30


async def test_every_thread_of_a_ddm_vm_with_its_stack(tmp_path):
    (port,) = free_port_range(1)
    vm_id = f"tcp:{port}"
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            sim = await h.start_sim(port, threads=5)
            await h.wait_vm(vm_id, lambda v: v["state"] == "ready" and v["threads"], timeout=10)
            response = await h.client.get(f"/api/v1/vms/{vm_id}/stacks")
            assert response.status_code == 200, response.text
            body = response.json()
            listed = (await h.client.get(f"/api/v1/vms/{vm_id}/threads")).json()["threads"]
    assert (body["source"], body["text"], body["deadlocked"]) == ("STKL", None, None)
    assert [(t["id"], t["name"]) for t in body["threads"]] == sorted(
        (t["id"], t["name"]) for t in listed
    )
    for thread in body["threads"]:
        expected = sim._threads.stack_trace(thread["id"])
        assert expected is not None
        assert thread["frames"] == [
            {"class_name": f.class_name, "method_name": f.method_name,
             "file_name": f.file_name, "line": f.line}
            for f in expected.frames
        ], thread["name"]  # fmt: skip
        assert "error" not in thread
