"""Requests answered by pushes or silence (protocol.md 2.2), against every VM family's behaviour.

The daemon runs for real over loopback; the simulated VM plays:

- ``art`` (the default, a current phone: ART 9+ without its agent): no reply at all when a
  handler returns nothing -- HPGC, HPSG, HPIF, THEN are answered only by the pushes they cause;
- ``legacy`` (Dalvik, ART 5-8): an empty reply in the same cases;
- a VM that answers FAIL: then, and only then, the feature is refused, with a sentence;
- ``modern`` (Android 12+): the heap and thread handlers are gone.

ddmd must never mark a feature unsupported because a request that is not answered on ART got
no answer; ``ddmd gc`` completes with the GC's heap-info push, ``heap --segments`` with HPEN.
"""

from __future__ import annotations

from collections import Counter

import pytest
import trio

from tests.actors.rawpeers import free_port_range, monitor

CAP = 30  # seconds: absolute cap on every test
ROUNDS = 10


def vm_id(port: int) -> str:
    return f"tcp:{port}"


@pytest.mark.parametrize("flavor", ["art", "legacy"])
async def test_gc_and_segments_ten_times_in_a_row(tmp_path, flavor: str) -> None:
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            sim = await h.start_sim(port, flavor=flavor, heap_mb=2)
            await h.wait_vm(vm_id(port), lambda v: v["state"] == "ready" and bool(v["heaps"]))
            base = f"/api/v1/vms/{vm_id(port)}"
            for _ in range(ROUNDS):
                gcs = sim.statistics().gcs
                response = await h.client.post(f"{base}/gc")
                assert response.status_code == 200, response.text
                body = response.json()
                assert body["gc"] == "done", body
                assert body["confirmed"] is True
                # ART 9+ is silent: only the GC's heap-info push can confirm it.
                if flavor == "art":
                    assert body["confirmed_by"] == "heap info"
                assert sim.statistics().gcs == gcs + 1

                response = await h.client.get(f"{base}/heap", params={"segments": "1"})
                assert response.status_code == 200, response.text
                body = response.json()
                (image,) = body["images"]
                assert image["complete"] is True
                assert image["problems"] == []
                (heap,) = body["heaps"]
                # The heap info pushed by the dump's GC counts the same bytes as its segments.
                assert image["summary"]["bytes_used"] == heap["bytes_allocated"]

            vm = await h.vm(vm_id(port))
            assert vm is not None
            assert vm["unsupported"] == [], vm["missing"]
            assert vm["missing"] == {}
            assert not h.events("vm.feature_unsupported")


async def test_overlapping_segment_dumps_both_complete(tmp_path) -> None:
    """Two heap dumps asked at once share the segment switch; neither times out, and the
    switch is turned off again only after both are done."""
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            await h.start_sim(port, heap_mb=1)
            await h.wait_vm(vm_id(port), lambda v: v["state"] == "ready" and bool(v["heaps"]))
            url = f"/api/v1/vms/{vm_id(port)}/heap"
            statuses: list[int] = []

            async def dump() -> None:
                response = await h.client.get(url, params={"segments": "1"})
                statuses.append(response.status_code)

            for _ in range(3):
                async with trio.open_nursery() as nursery:
                    for _ in range(3):
                        nursery.start_soon(dump)
            assert statuses == [200] * 9


@pytest.mark.parametrize("flavor", ["art", "legacy"])
async def test_a_vm_that_answers_fail_is_refused_with_a_sentence(tmp_path, flavor: str) -> None:
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path) as h:
            await h.start_sim(port, flavor=flavor, fail_types=("HPGC", "HPSG"), app_name="com.x.f")
            await h.wait_vm(vm_id(port), lambda v: v["state"] == "ready" and bool(v["heaps"]))
            base = f"/api/v1/vms/{vm_id(port)}"

            response = await h.client.post(f"{base}/gc")
            assert response.status_code == 501, response.text
            message = response.json()["error"]
            assert message.startswith("com.x.f does not run garbage collections on request")
            assert "it refused" in message
            assert "HPGC" not in message

            response = await h.client.get(f"{base}/heap", params={"segments": "1"})
            assert response.status_code == 501, response.text
            message = response.json()["error"]
            assert "heap segments" in message or "garbage collections" in message
            assert "HPSG" not in message

            vm = await h.vm(vm_id(port))
            assert vm is not None
            assert {"HPGC", "HPSG"} <= set(vm["unsupported"]) <= {"HPGC", "HPSG"}
            assert "it refused" in vm["missing"]["HPGC"]
            # Refused from then on, at once, with the same sentence.
            response = await h.client.post(f"{base}/gc")
            assert response.status_code == 501
            logged = Counter(e["feature"] for e in h.events("vm.feature_unsupported"))
            assert set(logged.values()) == {1}, logged


async def test_modern_flavor_reports_what_is_missing_once(tmp_path) -> None:
    (port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([port], tmp_path, timeouts={"ddm_request": 0.4}) as h:
            await h.start_sim(
                port,
                flavor="modern",
                pid=5151,
                app_name="com.example.modern",
                package_name="com.example.modern",
            )
            vm = await h.wait_vm(vm_id(port), lambda v: "HPIF" in v["unsupported"])
            assert vm["pid"] == 5151  # identity still works
            assert vm["name"] == "com.example.modern"
            assert vm["ddm"] is True

            url = f"/api/v1/vms/{vm_id(port)}/threads"
            # Two requests at once, then more: thread states time out once, never asked again.
            async with trio.open_nursery() as nursery:
                for _ in range(2):
                    nursery.start_soon(h.client.get, url)
            for _ in range(2):
                response = await h.client.get(url)
                assert response.status_code == 200
                assert response.json()["supported"] is False

            response = await h.client.get(f"/api/v1/vms/{vm_id(port)}/heap?segments=1")
            assert response.status_code == 501  # known without asking: no heap info at all
            message = response.json()["error"]
            assert message.startswith("com.example.modern does not report heap segments")
            assert "Android 12" in message

            response = await h.client.post(f"/api/v1/vms/{vm_id(port)}/gc")
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["gc"] == "requested"
            assert body["confirmed"] is False
            assert "does not report heap information" in body["note"]

            vm = await h.vm(vm_id(port))
            assert vm is not None
            # Silence to a request that is never answered on ART is not evidence: THEN and
            # HPGC stay; the thread states and heap information that never came are.
            assert set(vm["unsupported"]) == {"HPIF", "HPSG", "THST"}
            assert "THST" in vm["missing"]
            assert all("does not report" in sentence for sentence in vm["missing"].values())
            logged = Counter(e["feature"] for e in h.events("vm.feature_unsupported"))
            assert logged == Counter(vm["unsupported"]), logged
