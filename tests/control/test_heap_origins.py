"""Which GC the heap table and the segment summaries come from (`ddmd.control.origins`): the
words the API gives in ``origins`` and `ddmd heap` prints (the web page shows the same words,
tests/web/test_heap_origins_page.py). Driven through the in-process app with fake VMs, as
tests/control/test_cli_client.py does."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from typing import Any

from ddmd.cli.client import gc, heap
from ddmd.cli.jvm import format_heap_any
from ddmd.control.origins import HeapOrigins, heaps_origin, images_origin, jvm_origin
from ddmd.session.model import HeapInfoSnapshot
from tests.control.fakes import heap_image, sample_heap_info
from tests.control.test_cli_client import (  # noqa: F401 (fixtures)
    api,
    invoke,
    no_user_config,
    vms,
)

TARGET = "emulator-5554/1234"
VM_OWN = "after a GC of the VM's own (or the app's System.gc())"
OURS = "after the GC ddmd ran"
OUR_DUMP = "after the GC ddmd ran for a segment dump"
CLOCK = r"\d\d:\d\d:\d\d"


def _heaps(reason: int, stamp_ms: int = 1_700_000_000_000) -> tuple[HeapInfoSnapshot, ...]:
    (h,) = sample_heap_info()
    return (dataclasses.replace(h, reason=reason, timestamp_ms=stamp_ms),)


def _local(epoch: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch))


# ------------------------------------------------------------------------------ the words


def test_the_heap_figures_say_why_the_vm_sent_them() -> None:
    stamp = 1_700_000_000_000
    assert heaps_origin(_heaps(3, stamp)) == {"at": stamp / 1000, "why": VM_OWN, "gc": "vm"}
    assert heaps_origin(_heaps(2))["why"] == OURS  # "at the next GC": asked before ddmd's GC
    now = heaps_origin(_heaps(1))
    assert now["why"] == "asked for by ddmd as they were (no GC)"
    assert now["gc"] == "none"
    assert heaps_origin(()) is None
    # "At every GC" covers ddmd's GCs too: the figures ddmd's GC brought are named as its.
    ours = _heaps(3)
    assert heaps_origin(ours, ours=ours)["gc"] == "ddmd"
    assert heaps_origin(_heaps(3, stamp + 1), ours=ours)["gc"] == "vm"


def test_segments_from_a_dump_ddmd_did_not_take_say_so() -> None:
    origin = images_origin((heap_image(),), _heaps(3), None)
    assert origin is not None
    assert origin["at"] is None
    assert origin["gc"] == "vm"
    assert "ddmd did not run" in origin["why"]
    assert images_origin((), _heaps(3), None) is None


def test_segments_and_figures_from_different_gcs_are_told_apart() -> None:
    origins = HeapOrigins()
    images = (heap_image(),)
    at_dump = _heaps(3, 1_700_000_000_000)
    origins.dumped("vm", images, (_heaps(3, 1_699_999_990_000), at_dump), 1_700_000_000.5)
    same = origins.origins("vm", at_dump, images)
    assert same["images"] == {"at": 1_700_000_000.5, "why": OUR_DUMP, "gc": "ddmd", "note": None}
    assert same["heaps"]["why"] == OURS
    later = origins.origins("vm", _heaps(3, 1_700_000_009_000), images)
    assert later["images"]["note"] == (
        "the heap figures above come from a later GC than these segments"
    )
    assert later["heaps"]["why"] == VM_OWN
    # No heap figures came with the dump's GC (HPIF at every GC is off): older ones.
    origins.dumped("vm", images, (at_dump, at_dump), 1_700_000_001.0)
    older = origins.origins("vm", at_dump, images)
    assert older["images"]["note"] == "the heap figures above come from before these segments' GC"
    assert older["heaps"]["why"] == OURS  # still those of the earlier dump's GC
    # Another dump (not ddmd's) replaced the images: no time, no claim.
    other = origins.origins("vm", at_dump, (heap_image(),))
    assert other["images"]["at"] is None
    assert other["images"]["gc"] == "vm"


def test_a_plain_jvms_figures_name_jcmd_and_the_collector() -> None:
    origin = jvm_origin({"collector": "G1"}, 1_700_000_000.0)
    assert origin == {
        "at": 1_700_000_000.0,
        "why": "jcmd GC.heap_info as the heap was (no GC, G1 collector)",
        "gc": "none",
    }
    after = jvm_origin({"collector": "Serial"}, 1.0, after_gc=True)
    assert after["why"] == (
        "jcmd GC.heap_info right after the GC ddmd ran (GC.run, Serial collector)"
    )
    assert jvm_origin({}, 1.0)["why"] == "jcmd GC.heap_info as the heap was (no GC)"
    body = {
        "vm": {"id": "tcp:8000", "name": "Prog", "pid": 4242},
        "heaps": [],
        "images": [],
        "jvm_heap": {"collector": "G1", "used": 1 << 20, "committed": 2 << 20, "max": 4 << 20},
        "origins": {"heaps": origin, "images": None},
    }
    said = format_heap_any(body).splitlines()
    assert said[-1] == (
        f"  taken at {_local(1_700_000_000.0)}, "
        "jcmd GC.heap_info as the heap was (no GC, G1 collector)"
    )


# ------------------------------------------------------------------------------ ddmd heap


def test_ddmd_heap_says_which_gc_the_figures_come_from(api) -> None:  # noqa: F811
    stamp = 1_700_000_000_000
    api["app"].update(heaps=_heaps(3, stamp))
    out = invoke(heap, TARGET).stdout.splitlines()
    assert out[3] == f"  taken at {_local(stamp / 1000)}, {VM_OWN}"
    body = json.loads(invoke(heap, TARGET, "--json").stdout)
    assert body["origins"]["heaps"]["why"] == VM_OWN
    assert body["origins"]["images"] is None


def test_ddmd_heap_after_ddmd_gc_names_ddmds_gc(api) -> None:  # noqa: F811
    api["app"].update(heaps=_heaps(3))
    assert invoke(gc, TARGET).exit_code == 0
    out = invoke(heap, TARGET).stdout
    assert f", {OURS}\n" in out + "\n"
    assert VM_OWN not in out


def _gc_brings(vm: Any, heaps: tuple[HeapInfoSnapshot, ...]) -> None:
    """The fake's segment dump brings new heap figures, as ART's HPIF after the dump's GC."""
    dump = vm.heap_segments

    async def dump_with_figures() -> Any:
        vm.update(heaps=heaps)
        return await dump()

    vm.heap_segments = dump_with_figures


def test_ddmd_heap_segments_says_the_dumps_gc_and_when_the_figures_differ(api) -> None:  # noqa: F811
    api["app"].update(heaps=_heaps(3))
    _gc_brings(api["app"], _heaps(3, 1_700_000_030_000))
    out = invoke(heap, TARGET, "--segments").stdout
    # The figures came with the dump's GC: both say ddmd's GC, no note.
    assert re.search(rf"^  taken at {CLOCK}, {OURS}$", out, re.M), out
    assert re.search(rf"^  taken at {CLOCK}, {OUR_DUMP}$", out, re.M), out
    assert "note:" not in out
    # The VM ran a GC of its own since: new figures, the same segments.
    api["app"].update(heaps=_heaps(3, 1_700_000_060_000))
    out = invoke(heap, TARGET).stdout
    assert f"  taken at {_local(1_700_000_060)}, {VM_OWN}" in out
    assert re.search(rf"^  taken at {CLOCK}, {OUR_DUMP}$", out, re.M), out
    assert "  note: the heap figures above come from a later GC than these segments" in out


def test_a_dump_without_new_figures_says_the_figures_are_older(api) -> None:  # noqa: F811
    api["app"].update(heaps=_heaps(3))
    out = invoke(heap, TARGET, "--segments").stdout
    assert f", {VM_OWN}\n" in out
    assert "  note: the heap figures above come from before these segments' GC" in out


def test_ddmd_heap_with_segments_ddmd_did_not_take(api) -> None:  # noqa: F811
    api["app"].images = (heap_image(),)
    out = invoke(heap, TARGET).stdout
    assert "  taken at a time ddmd does not know, after a GC ddmd did not run" in out
    assert "  note: ddmd cannot tell whether the heap figures above come from the same GC" in out
