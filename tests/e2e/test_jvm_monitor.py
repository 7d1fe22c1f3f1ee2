"""A real HotSpot JVM in the scan range: monitored as a plain JDWP VM, never disturbed.

HotSpot has no DDM: it refuses HELO with error 99. ddmd must then mark it ``ddm: false``,
ask VirtualMachine.Version once for its description, and send nothing else, while holding
the JVM's only JDWP connection. The program keeps running meanwhile (``suspend=n``).
"""

from __future__ import annotations

import json

import pytest
import trio

from tests.actors.rawpeers import monitor, wait_until
from tests.e2e.conftest import CounterJvm

pytestmark = pytest.mark.jvm

CAP = 30  # seconds for the whole test


async def test_real_jvm_is_plain_jdwp_and_keeps_running(counter_jvm: CounterJvm, tmp_path) -> None:
    jvm = counter_jvm
    vm_id = f"tcp:{jvm.port}"
    with trio.fail_after(CAP):
        async with monitor([jvm.port], tmp_path) as h:
            vm = await h.wait_vm(vm_id, lambda v: v["description"] is not None, timeout=10)
            assert vm["ddm"] is False
            assert vm["description"].startswith("Java Debug Wire Protocol"), vm["description"]
            assert vm["state"] == "ready"
            assert vm["unsupported"] == ["HELO"]
            assert vm["features"] == []
            # HotSpot says no pid over JDWP: ddmd found the process in /proc (jps-style name).
            assert vm["pid"] == jvm.process.pid
            assert vm["app"] == "Counter"
            identified_at = jvm.count
            assert identified_at is not None, jvm.text()

            # Threads come over JDWP for a plain JVM (issue 20; never DDM's THST).
            response = await h.client.get(f"/api/v1/vms/{vm_id}/threads")
            assert response.status_code == 200, response.text
            assert response.json()["supported"] is True
            assert "main" in {t["name"] for t in response.json()["threads"]}

            result = await h.cli("clients", "--json")
            assert result.exit_code == 0, result.output
            (listed,) = json.loads(result.output)
            assert listed["id"] == vm_id
            assert listed["ddm"] is False

            # The program keeps running while ddmd holds its one JDWP connection: 15 more
            # lines is 1.5 s of the 100 ms loop.
            await wait_until(
                lambda: jvm.count is not None and jvm.count >= identified_at + 15,
                15,
                what="the JVM's counter advanced",
            )
            vm = await h.vm(vm_id)
            assert vm is not None  # still connected and listed
            assert vm["ddm"] is False

        assert len(h.events("vm.not_ddm", vm=vm_id)) == 1
        assert [e["feature"] for e in h.events("vm.feature_unsupported")] == ["HELO"]
        version = h.events("vm.version", vm=vm_id)
        assert version
        assert version[0]["description"].startswith("Java Debug Wire Protocol")
        assert not h.events("vm.protocol_error")
        assert jvm.process.returncode is None, "the JVM exited while ddmd held it"
