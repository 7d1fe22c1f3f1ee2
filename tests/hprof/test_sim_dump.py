"""The simulated VM's heap dumps (ddmd.sim.hprof): read back by ddmd's reader, accepted by
the real hprof-conv, and `ddmd hprof-summary` on both files finds the recorded counts."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddmd.cli.main import main
from ddmd.protocol.hprof import HprofReader, summarise_file, summarise_stream
from ddmd.sim.hprof import (
    ArraySpec,
    ClassSpec,
    HeapContent,
    LargeDump,
    dump_bytes,
    dump_chunks,
    sim_heap_content,
)
from tests.actors.needs import skip_or_fail

DEBIAN_HPROF_CONV = Path("/usr/lib/android-sdk/platform-tools/hprof-conv")


def hprof_conv() -> str:
    """The real hprof-conv; skip when it is missing, but fail in CI (CI=true)."""
    found = shutil.which("hprof-conv")
    if found is None and os.environ.get("ANDROID_HOME"):
        candidate = Path(os.environ["ANDROID_HOME"]) / "platform-tools" / "hprof-conv"
        found = str(candidate) if candidate.exists() else None
    if found is None and DEBIAN_HPROF_CONV.exists():
        found = str(DEBIAN_HPROF_CONV)
    if found is None:
        reason = "hprof-conv is not installed (Debian package 'hprof-conv')"
        skip_or_fail(reason)
    return found


def summary_json(path: Path) -> dict:
    result = CliRunner().invoke(main, ["hprof-summary", str(path), "--json", "--top", "0"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def counts_of(body: dict) -> dict[str, int]:
    return {row["class"]: row["instances"] for row in body["classes"]}


@pytest.fixture(scope="module")
def content() -> HeapContent:
    return sim_heap_content("com.example.mail")


@pytest.fixture
def sim_file(content, tmp_path) -> Path:
    path = tmp_path / "com.example.mail.hprof"
    path.write_bytes(dump_bytes(content))
    return path


# --------------------------------------------------------------------------- the writer


def test_the_dump_holds_the_recorded_objects_per_heap(content):
    summary = summarise_stream(dump_chunks(content))
    found = {e.name: {s.heap: s.instances for s in e.heaps} for e in summary.classes}
    assert found == content.expected_by_heap()
    assert summary.version == "JAVA PROFILE 1.0.3"
    assert summary.id_size == 4
    assert summary.heaps == ("app", "image", "zygote")
    # the recording itself: a few classes, as sim_heap_content sets them
    expected = content.expected_instances()
    assert expected["com.example.mail.Message"] == 250
    assert expected["java.lang.String"] == 600
    assert expected["byte[]"] == 120
    assert expected["java.lang.Class"] == len(content.all_classes())


def test_the_dump_is_deterministic_and_cut_like_art(content):
    data = dump_bytes(content)
    assert data == dump_bytes(sim_heap_content("com.example.mail"))
    assert data != dump_bytes(sim_heap_content("com.example.maps"))
    assert data.startswith(b"JAVA PROFILE 1.0.3\0\0\0\0\x04")
    # ART's segments: at most 128 objects or about 4 KiB each (a walk over the records)
    at, segments = len(b"JAVA PROFILE 1.0.3\0") + 12, []
    while at < len(data):
        tag, length = data[at], struct.unpack_from(">I", data, at + 5)[0]
        if tag == 0x1C:
            segments.append(length)
        at += 9 + length
    assert at == len(data)
    assert len(segments) >= summarise_stream([data]).instances // 128
    assert max(segments) < 4096 + 2048


def test_array_classes_and_element_types_come_from_the_content():
    content = HeapContent(
        classes=(ClassSpec("java.lang.Object", "image", (("app", 2),), super_name=None),),
        arrays=(ArraySpec("short", "zygote", 3, 5), ArraySpec("a.B", "app", 1, 2)),
    )
    summary = summarise_stream([dump_bytes(content)])
    assert summary.instance_counts() == {
        "java.lang.Object": 2,
        "short[]": 3,
        "a.B[]": 1,
        "java.lang.Class": 3,  # Object, short[], a.B[]
    }
    assert summary.by_name()["short[]"].shallow_bytes == 3 * 5 * 2


# --------------------------------------------------------------------------- real hprof-conv


def test_hprof_conv_accepts_the_dump_and_both_files_give_the_recorded_counts(
    content, sim_file, tmp_path
):
    tool = hprof_conv()
    converted = tmp_path / "converted.hprof"
    result = subprocess.run(
        [tool, str(sim_file), str(converted)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert converted.read_bytes().startswith(b"JAVA PROFILE 1.0.2\0")

    android = summary_json(sim_file)
    standard = summary_json(converted)
    assert counts_of(android) == content.expected_instances()
    assert counts_of(standard) == content.expected_instances()
    assert android["heaps"] == ["app", "image", "zygote"]
    assert standard["heaps"] == ["default"]  # hprof-conv drops the heap records
    assert standard["heap_info"] is False
    app = {k: v["app"] for k, v in content.expected_by_heap().items() if "app" in v}
    assert {
        row["class"]: row["heaps"]["app"]["instances"]
        for row in android["classes"]
        if "app" in row["heaps"]
    } == app


def test_hprof_conv_z_keeps_the_app_heap_objects(content, sim_file, tmp_path):
    """`hprof-conv -z` drops the zygote and image objects (it keeps every class object):
    what remains is exactly what the dump put in the app heap."""
    tool = hprof_conv()
    converted = tmp_path / "app-only.hprof"
    result = subprocess.run(
        [tool, "-z", str(sim_file), str(converted)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    counts = summarise_file(converted).instance_counts()
    by_heap = content.expected_by_heap()
    app = {k: v["app"] for k, v in by_heap.items() if "app" in v and k != "java.lang.Class"}
    assert counts.pop("java.lang.Class") == content.expected_instances()["java.lang.Class"]
    assert counts == app


# --------------------------------------------------------------------------- large dumps


def test_a_large_dump_streams_valid_data_of_the_exact_size():
    dump = LargeDump(50_000_000)
    reader = HprofReader()
    total = 0
    for piece in dump.chunks():
        total += len(piece)
        reader.feed(piece)
    summary = reader.finish()
    assert total == 50_000_000
    assert summary.instance_counts() == dump.expected_instances()
    assert dump.arrays == 48  # 1 MiB arrays
    assert summary.by_name()["byte[]"].in_heap("app").instances == dump.arrays
    assert summary.shallow_bytes > 49_000_000


@pytest.mark.parametrize("size", [2_000, 1_000_000, (1 << 20) * 3, (1 << 20) * 3 + 40])
def test_large_dump_sizes_are_exact_at_any_size(size):
    dump = LargeDump(size, array_bytes=1 << 20)
    data = b"".join(dump.chunks())
    assert len(data) == size
    assert summarise_stream([data]).instance_counts() == dump.expected_instances()


def test_a_large_dump_cannot_be_smaller_than_its_frame():
    with pytest.raises(ValueError, match="cannot be as small"):
        LargeDump(100).expected_instances()


def test_content_with_an_unknown_heap_or_a_negative_count_is_refused():
    with pytest.raises(ValueError, match="unknown heaps"):
        HeapContent((ClassSpec("a.B", "native"),))
    with pytest.raises(ValueError, match="cannot be negative"):
        HeapContent((ClassSpec("a.B", "app", (("app", -1),)),))
